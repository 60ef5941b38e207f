"""The subcommands of ``python -m course``, one module per area; each returns a dict (printed as JSON with
--json).

* ``setup``: fetch, info
* ``experiments``: stream, needle, generate, chat
* ``train``: train
* ``bench``: bench (its --notebooks, --grading and --transformers-cache runs use the instructor's tools)
* ``instructor``: host, release, grade, gradebook, check-outputs, site, notebooks, architecture
* ``science``: reproductions, explore, reproduce
* ``args``: what they share (``Command``, argparse types, the model and policy arguments)

``GROUPS`` is how ``python -m course --help`` lists them, in the words and order of docs/command-line.md (a test
holds the two together).
"""

from __future__ import annotations

from typing import NamedTuple

from course.cli import bench, experiments, instructor, science, setup, train
from course.cli.args import Command

__all__ = ["COMMANDS", "Command", "GROUPS", "Group", "groups_help"]


class Group(NamedTuple):
    """A group of commands as ``--help`` and docs/command-line.md list it: its title, one line, its commands."""

    title: str
    line: str
    commands: tuple[str, ...]


GROUPS: tuple[Group, ...] = (
    Group("set up", "bring the offline model and texts into the course cache, verify them, show what is available",
          ("fetch", "info")),
    Group("experiments", "run a policy from the terminal: a long stream's perplexity, passkey retrieval, generation "
                         "and chat", ("stream", "needle", "generate", "chat")),
    Group("training", "pretrain notebook 06's tiny models, with or without a sink token, once, into the course cache",
          ("train",)),
    Group("benchmarks", "speed and memory as ratios measured side by side in one run; notebook wall times; grading "
                        "throughput", ("bench",)),
    Group("teaching", "list the notebooks, release the student copies, grade submissions, build the course site",
          ("notebooks", "host", "release", "grade", "gradebook", "check-outputs", "site")),
    Group("science", "the reproduction table from executed notebooks; notebooks run on the exploration split; "
                     "every asserted claim re-run on a fresh draw", ("reproductions", "explore", "reproduce")),
    Group("contributors", "draw the layers of the package from its imports", ("architecture",)),
)

_BY_NAME = {c.name: c for c in [*setup.COMMANDS, *experiments.COMMANDS, *train.COMMANDS, *bench.COMMANDS,
                                *instructor.COMMANDS, *science.COMMANDS]}
COMMANDS: list[Command] = [_BY_NAME[name] for group in GROUPS for name in group.commands]  # in the groups' order
if sorted(_BY_NAME) != sorted(c.name for c in COMMANDS):
    raise RuntimeError(f"every command belongs to one group of course.cli.GROUPS: {sorted(_BY_NAME)}")


def groups_help() -> str:
    """The command groups, a title and one line each, then their commands: the epilog of ``--help``."""
    lines = ["command groups (docs/command-line.md; `python -m course COMMAND --help` for one command's options):"]
    for group in GROUPS:
        lines += [f"  {group.title}: {group.line}", f"      {', '.join(group.commands)}"]
    return "\n".join(lines)
