"""Every notebook's exercises: importing this package registers their checkers."""

from course.grading.exercises import nb01  # noqa: F401
from course.grading.exercises import nb02  # noqa: F401
from course.grading.exercises import nb03  # noqa: F401
from course.grading.exercises import nb04  # noqa: F401
from course.grading.exercises import nb05  # noqa: F401
from course.grading.exercises import nb06  # noqa: F401
from course.grading.exercises import nb07  # noqa: F401
from course.grading.exercises import questions  # noqa: F401  (every notebook's checked questions)
