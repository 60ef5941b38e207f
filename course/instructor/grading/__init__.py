"""The autograder: sandboxed kernels (``sandbox``), the grader's side of a check (``remote``) and the kernel's
(``worker``), what crosses between them (``wire``), who a submission belongs to (``submissions``), the source scan
(``scan``), the gradebook (``gradebook``) and the run that ties them together (``grade``). The checkers themselves
are the course's, in ``course.exercises``."""
