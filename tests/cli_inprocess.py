"""One CLI command run in-process with its output captured and environment variables set for it alone (the
boundary-check and redaction tests share it)."""

from __future__ import annotations

import contextlib
import io
import os

from tailsieve.cli import main


def run(argv: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """One CLI command in-process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    old = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(argv)
            except SystemExit as exc:
                rc = exc.code if isinstance(exc.code, int) else 1
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return rc, out.getvalue(), err.getvalue()
