"""``python -m tests.alternatives [ID ...]``: every alternative (or those of the exercises named) through its
exercise's checker, in this process; prints one line each and exits 1 when one is refused.

``python -m tests.alternatives --similarity``: measure what they score against the course's solutions in the
similarity report, per notebook, and write it to ``course/instructor/grading/independent_similarity.py`` (the
bar from which the report flags a pair with the course's solutions; ``tests/instructor/test_similarity.py``
checks the file against the alternatives)."""

from __future__ import annotations

import sys

from course.exercises.checking import get
from course.exercises.core import outcome
from tests.alternatives import files, function_names, load, student_copy


def main(ids: list[str]) -> int:
    refused = 0
    for ex_id, paths in sorted(files().items()):
        if ids and ex_id not in ids and ex_id[:2] not in ids:
            continue
        name = function_names(student_copy(ex_id[:2]))[ex_id]
        for path in paths:
            status, feedback, points = outcome(get(ex_id), load(path, name))
            refused += status != "pass"
            print(f"{ex_id:28} {path.name:28} {status:9} {points} {feedback[:400]}", flush=True)
    return 1 if refused else 0


def write_similarity() -> int:
    from course.instructor.grading.similarity import INDEPENDENT_FILE
    from tests.alternatives import independent_similarity

    scores = independent_similarity()
    rows = "".join(f'    "{number}": {score},\n' for number, score in scores.items())
    INDEPENDENT_FILE.write_text(
        '"""Per notebook, the highest similarity score that correct solutions written independently of the course\'s\n'
        "(tests/alternatives) reach against the course's solutions in the similarity report. Written by\n"
        '``python -m tests.alternatives --similarity``; tests/instructor/test_similarity.py checks it."""\n\n'
        f"INDEPENDENT: dict[str, float] = {{\n{rows}}}\n", encoding="utf-8")
    print(f"{INDEPENDENT_FILE}: {scores}")
    return 0


if __name__ == "__main__":
    sys.exit(write_similarity() if sys.argv[1:] == ["--similarity"] else main(sys.argv[1:]))
