"""Per notebook, the highest similarity score that correct solutions written independently of the course's
(tests/alternatives) reach against the course's solutions in the similarity report. Written by
``python -m tests.alternatives --similarity``; tests/instructor/test_similarity.py checks it."""

INDEPENDENT: dict[str, float] = {
    "01": 0.314,
    "02": 0.166,
    "03": 0.073,
    "04": 0.419,
    "05": 0.415,
    "06": 0.144,
    "07": 0.151,
    "08": 0.36,
    "09": 0.269,
}
