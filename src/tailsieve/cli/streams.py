"""The CLI's standard streams: ASCII-safe output where the encoding needs it, quiet broken pipes.

- `ascii_safe()`: when stdout's or stderr's encoding cannot write TailSieve's symbols (`PYTHONIOENCODING=ascii`, a
  C locale), the stream keeps its encoding and writes each such character as ASCII (`×` → `x`, `±` → `+-`, `τ` →
  `tau`, then the character's decomposition, then `?`), so no command fails on a symbol it prints.
- `broken_pipe()`: the reader of stdout went away (`tailsieve simulate | head -c 10`): stdout is pointed at the null
  device so that nothing more is written or reported, and the exit status is the conventional 141 (128 + SIGPIPE).
"""

from __future__ import annotations

import codecs
import os
import sys
import unicodedata
from typing import TextIO

__all__ = ["BROKEN_PIPE_EXIT", "ERRORS", "ascii_safe", "broken_pipe", "to_ascii"]

BROKEN_PIPE_EXIT = 128 + 13  # killed by SIGPIPE, as `yes | head -1` reports for `yes`
ERRORS = "tailsieve-ascii"  # the codec error handler registered below
PROBE = "×±τ…→"  # characters every command may print

_ASCII = {
    "×": "x", "−": "-", "–": "-", "—": "--", "±": "+-", "·": "*", "…": "...", "→": "->", "←": "<-", "≤": "<=",
    "≥": ">=", "≈": "~", "≠": "!=", "∞": "inf", "÷": "/", "√": "sqrt", "§": "S", "⌈": "ceil(", "⌉": ")",
    "⌊": "floor(", "⌋": ")", "τ": "tau", "ρ": "rho", "α": "alpha", "β": "beta", "γ": "gamma", "σ": "sigma",
    "λ": "lambda", "μ": "mu", "Σ": "sum", "Π": "prod", "‖": "|", "′": "'", "“": '"', "”": '"', "‘": "'", "’": "'",
    "✓": "ok", "✗": "x", "█": "#", "━": "-", "│": "|", "─": "-",
}


def to_ascii(text: str) -> str:
    """`text` with every non-ASCII character written as ASCII (the table above, else its NFKD decomposition without
    combining marks, else `?`)."""
    out = []
    for ch in text:
        if ch.isascii():
            out.append(ch)
        elif ch in _ASCII:
            out.append(_ASCII[ch])
        else:
            plain = unicodedata.normalize("NFKD", ch).encode("ascii", "ignore").decode()
            out.append(plain or "?")
    return "".join(out)


def _replace(exc: UnicodeError) -> tuple[str, int]:
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    return to_ascii(exc.object[exc.start : exc.end]), exc.end


codecs.register_error(ERRORS, _replace)


def _needs_ascii(stream: TextIO) -> bool:
    try:
        PROBE.encode(stream.encoding or "ascii")
    except (UnicodeEncodeError, LookupError):
        return True
    return False


def ascii_safe() -> None:
    """Make stdout and stderr write TailSieve's symbols as ASCII where their encoding cannot (see the docstring);
    streams that can (UTF-8), or that cannot be reconfigured (a test's StringIO), are left alone."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and _needs_ascii(stream):
            reconfigure(errors=ERRORS)


def broken_pipe() -> int:
    """After a `BrokenPipeError` on stdout: stdout onto the null device (the final flush then succeeds quietly);
    the exit status of a command whose reader left."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # stdout is no file (a test's StringIO): nothing to redirect
        pass
    return BROKEN_PIPE_EXIT
