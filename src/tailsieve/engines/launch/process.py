"""Process, port and health helpers of launchers that run replicas as local process groups: free ports, the
server's own error line from its log, `/health`, and SIGTERM → SIGKILL of whole process groups."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from tailsieve.redact import clip

_ERROR_LINE = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt))\b(:.*)?$")
_FATAL_LINE = re.compile(r"^Fatal Python error: .*")  # a crash in C (an illegal instruction, a segfault)
# vLLM's log prefixes: the process tag `(EngineCore_DP0 pid=12) `, then `ERROR 05-01 10:00:00 [core.py:12] `
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_PROC_TAG = re.compile(r"^\([\w.-]+ pid=\d+\)\s*")
_LOG_HEAD = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)?\s+\[[^\]]*\]\s*")
LAUNCH_MARK = "== tailsieve "  # the header a launcher writes before each start of a server (`_spawn`)


def port_free(host: str, port: int) -> bool:
    """True when nothing listens on (host, port) and it can be bound."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def pick_port(host: str, taken: set[int] | None = None) -> int:
    """An unused TCP port on `host` that is not in `taken`."""
    while True:
        with socket.socket() as s:
            s.bind((host, 0))
            p = int(s.getsockname()[1])
        if p not in (taken or set()):
            return p


def wait_port(host: str, port: int, timeout_s: float) -> bool:
    """Wait until (host, port) can be bound again; False after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not port_free(host, port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def http_healthy(url: str, timeout_s: float = 2.0, *, path: str = "/health") -> bool:
    """GET `url` + `path` (an engine kind's health path) answers 200."""
    try:
        with urllib.request.urlopen(f"{url}{path}", timeout=timeout_s) as r:
            return int(r.status) == 200
    except OSError:
        return False


def _bare(line: str) -> tuple[str, str | None]:
    """A log line without colours and vLLM's process tag and logger head; (text, its log level or None)."""
    text = _PROC_TAG.sub("", _ANSI.sub("", line).strip())
    head = _LOG_HEAD.match(text)
    return (text[head.end():], head.group(1)) if head else (text, None)


def server_error(log: Path, chars: int = 300, *, last_line: bool = True) -> str:
    """`_server_error`, redacted and clipped to `chars` with control characters escaped (a server's log may echo its
    own flags, `--api-key` included: issue 49)."""
    text = _server_error(log, chars * 4, last_line=last_line)
    return clip(text, chars - 24) if len(text) > chars else clip(text, chars)


def _server_error(log: Path, chars: int = 300, *, last_line: bool = True) -> str:
    """The server's own error from its log, since the launcher's last start header: a `Fatal Python error` line
    (a crash: the engine's own words), else the last exception line (plus a pydantic detail line), else the last
    ERROR/CRITICAL log message (vLLM's prefixes stripped: `EngineDeadError` logged by the API server), else the
    last non-empty line (`last_line`) or "no error in its log" (a server killed from outside logs none)."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    start = max((k + 1 for k, ln in enumerate(lines) if ln.startswith(LAUNCH_MARK)), default=0)
    bare = [_bare(ln) for ln in lines[start:]]
    fatal = [t for t, _ in bare if _FATAL_LINE.match(t)]
    if fatal:
        amx = [t for t, _ in bare if t.startswith("AmxPermissionError")]  # launch/vllm_server.py's report
        return (fatal[-1] + (f" ({amx[-1]})" if amx else ""))[:chars]
    for i in range(len(bare) - 1, -1, -1):
        msg = bare[i][0]
        if _ERROR_LINE.match(msg) and "Warning" not in msg:
            nxt = lines[start + i + 1] if i + 1 < len(bare) else ""
            if "validation error" in msg and nxt.startswith("  ") and nxt.strip():
                msg += ": " + nxt.strip().split(" [type=")[0]
            return msg[:chars]
    logged = [t for t, level in bare if level in ("ERROR", "CRITICAL") and t]
    if logged:
        return logged[-1][:chars]
    if not last_line:
        return "no error in its log"
    tail = [t for t, _ in bare if t]
    return tail[-1][:chars] if tail else "(empty log)"


def exit_how(code: int | None) -> str:
    """A process's return code in words: "exited with code 1", "killed by signal SIGKILL", "running"."""
    if code is None:
        return "running"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def group_alive(pgid: int) -> bool:
    """Some process of the process group `pgid` is still there."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def terminate(procs: Sequence[subprocess.Popen[bytes]], grace_s: float) -> None:
    """SIGTERM each process group, wait up to `grace_s` for all of them (leaders and children), SIGKILL the rest."""
    for p in procs:
        if p.poll() is None or group_alive(p.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        for p in procs:
            p.poll()
        if not any(group_alive(p.pid) for p in procs):
            break
        time.sleep(0.1)
    kill_groups(procs)


def kill_groups(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGKILL what is left of each process group at once and reap the leaders."""
    for p in procs:
        if group_alive(p.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=10)


def wait_group_gone(pgid: int, timeout_s: float = 5.0) -> bool:
    """Wait until no process of group `pgid` is left (children die with the group, but not instantly)."""
    deadline = time.monotonic() + timeout_s
    while group_alive(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def warm_up_error(url: str, model: str, tokens: int, timeout_s: float) -> str | None:
    """One short generation right after /health, so a fresh server's slow first batch (CPU vLLM with ngram: 1.16 s
    against 0.20 s for 8 × 256 tokens) lands in the start-up and not in the next step. None when it worked, was off
    (`tokens` ≤ 0) or the server wants an API key (401/403: left cold); else what went wrong."""
    if tokens <= 0:
        return None
    body = json.dumps({"model": model, "prompt": "Hello", "max_tokens": tokens, "temperature": 0.0,
                       "ignore_eos": True}).encode()
    req = urllib.request.Request(f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            r.read()
    except urllib.error.HTTPError as exc:
        return None if exc.code in (401, 403) else f"HTTP {exc.code} {exc.reason}"
    except OSError as exc:
        return str(exc)
    return None
