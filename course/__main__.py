"""Command line: ``python -m course <command> ...``; ``python -m course --help`` lists them.

Every expected failure (bad input, a missing or damaged asset, an unusable cache, a file that
cannot be read or written) ends in one line ``error: ...`` on stderr and exit status 2; a
traceback means a bug.
"""

from __future__ import annotations

import argparse
import json
import sys

from course import cli

EXPECTED = (ValueError, RuntimeError, OSError)  # UnicodeError and the asset errors included


def error_line(e: BaseException) -> str:
    """The one-line message of an expected failure."""
    if isinstance(e, OSError) and e.strerror:
        where = f" ({e.filename})" if e.filename else ""
        return f"{e.strerror}{where}"
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return "; ".join(lines) or type(e).__name__


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error reported as one line (the parameter, the value, what is allowed)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"error: {self.prog}: {message} (see `{self.prog} --help`)\n")


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m course", description="attention-sinks-course tools", epilog=cli.groups_help(),
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in cli.COMMANDS:
        command.add_parser(sub)
    args = parser.parse_args(argv)
    try:
        result = args.run(args)
    except EXPECTED as e:  # bad input, a missing or damaged asset, an unusable cache: a clear message
        print(f"error: {error_line(e)}", file=sys.stderr)
        return 2
    if getattr(args, "json", False) and result is not None:
        print(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
