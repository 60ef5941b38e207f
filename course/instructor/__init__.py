"""The instructor's toolchain, apart from what students read: grading, release, the site and its hosting,
notebook times, output checks and benchmarks.

Students open ``course`` for the mechanisms (models, the cache, policies, evaluation) and ``course.exercises``
for the checkers of their exercises; nothing here is imported by a notebook. Every tool is a command of
``python -m course`` (``grade``, ``gradebook``, ``release``, ``site``, ``host``, ``bench``, ``check-outputs``);
the grading machinery needs the ``instructor`` extra (``pip install "attention-sinks-course[instructor]"``).
"""
