"""`python -m tailsieve` and the `tailsieve` console script: run the command-line interface.

`run` imports the CLI itself, so that a Ctrl-C at any moment, even while the first modules load, is one line
(`tailsieve: interrupted`) and exit status 130, never a traceback. This module imports nothing else."""

import contextlib
import os
import sys


def run() -> int:
    """The CLI's exit status (`tailsieve.cli.main`), 130 on an interrupt before a command takes over."""
    try:
        from tailsieve.cli import main

        return main()
    except KeyboardInterrupt:
        return _interrupted()
    except Exception as exc:  # Python 3.11 wraps a Ctrl-C raised in a class's `__set_name__` while a module loads
        if not _interrupt_caused(exc):  # in RuntimeError: still the interrupt
            raise
        return _interrupted()


def _interrupted() -> int:
    with contextlib.suppress(OSError, ValueError):  # stderr already closed: the exit status says it
        print("tailsieve: interrupted", file=sys.stderr)
    return 130


def _interrupt_caused(exc: BaseException) -> bool:
    """Whether a KeyboardInterrupt is among the exception's causes and contexts."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, KeyboardInterrupt):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


def exit_after(rc: int) -> None:
    """Exit with `rc`. After an interrupt (rc > 128) the streams are flushed and the process ends at once: a Ctrl-C
    handled while the first modules load could otherwise still end the process by SIGINT at the interpreter's exit
    (status -2 instead of 130, `tests/test_hostile_streams.py`), and a second Ctrl-C there would print a traceback."""
    if rc > 128:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(rc)
    raise SystemExit(rc)


def console() -> None:
    """The `tailsieve` console script (pyproject.toml): `run`, then `exit_after` its status."""
    exit_after(run())


if __name__ == "__main__":
    console()
