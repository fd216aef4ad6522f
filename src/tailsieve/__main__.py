"""`python -m tailsieve` and the `tailsieve` console script: run the command-line interface.

`run` imports the CLI itself, so that a Ctrl-C at any moment, even while the first modules load, is one line
(`tailsieve: interrupted`) and exit status 130, never a traceback. This module imports nothing else."""

import contextlib
import sys


def run() -> int:
    """The CLI's exit status (`tailsieve.cli.main`), 130 on an interrupt before a command takes over."""
    try:
        from tailsieve.cli import main

        return main()
    except KeyboardInterrupt:
        with contextlib.suppress(OSError, ValueError):  # stderr already closed: the exit status says it
            print("tailsieve: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(run())
