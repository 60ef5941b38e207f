"""The subcommands of ``python -m course``, one module per group; each returns a dict (printed as JSON with
--json).

* ``setup``: fetch, info
* ``experiments``: stream, needle, generate, chat
* ``train``: train
* ``bench``: bench (its --notebooks, --grading and --transformers-cache runs use the instructor's tools)
* ``instructor``: host, release, grade, gradebook, check-outputs, reproductions, explore, site
* ``args``: what they share (``Command``, argparse types, the model and policy arguments)
"""

from __future__ import annotations

from course.cli import bench, experiments, instructor, setup, train
from course.cli.args import Command

__all__ = ["COMMANDS", "Command"]

COMMANDS: list[Command] = [*setup.COMMANDS, *experiments.COMMANDS, *train.COMMANDS, *bench.COMMANDS,
                           *instructor.COMMANDS]
