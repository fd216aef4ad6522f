"""Lines the CLI prints itself (errors, interrupts, warnings) fit the reader's terminal: at most `WIDTH` columns
(120, the tables' width), the terminal's if narrower, wrapped at spaces with continuation lines indented two
columns. Only on a terminal: written to a pipe or a file, a message stays one line, so that scripts and `grep` read
one error per line. Standard library only (imported before any command)."""

from __future__ import annotations

import shutil
import sys
import textwrap
from typing import TextIO

__all__ = ["WIDTH", "fit", "say"]

WIDTH = 120


def fit(line: str, width: int = WIDTH) -> str:
    """`line` wrapped to `width` columns (continuations indented two columns); unchanged when it fits."""
    if len(line) <= width:
        return line
    return "\n".join(textwrap.wrap(line, width=width, subsequent_indent="  ", break_long_words=True,
                                   break_on_hyphens=False))


def say(line: str, stream: TextIO | None = None) -> None:
    """Print `line` on `stream` (stderr), wrapped by `fit` when the stream is a terminal."""
    out = sys.stderr if stream is None else stream
    try:
        tty = out.isatty()
    except (AttributeError, ValueError):
        tty = False
    width = min(WIDTH, shutil.get_terminal_size((WIDTH, 24)).columns) if tty else 0
    print(fit(line, width) if tty else line, file=out)
