"""Command line: ``python -m course <command> ...``; ``python -m course --help`` lists them."""

from __future__ import annotations

import argparse
import json
import sys

from course import cli


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course", description="attention-sinks-course tools")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in cli.COMMANDS:
        command.add_parser(sub)
    args = parser.parse_args(argv)
    try:
        result = args.run(args)
    except (ValueError, RuntimeError) as e:  # bad input or a missing asset: a clear message, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    if getattr(args, "json", False) and result is not None:
        print(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
