"""`Launcher`: R local vLLM replicas (one process group each) started together, health-checked, moved between
the tail and the bulk pool between steps, and stopped cleanly.

`start()` checks the model path and the ports, launches every replica (CPU: `taskset -c CORES` and
`VLLM_CPU_OMP_THREADS_BIND`; GPU: `CUDA_VISIBLE_DEVICES`), then waits for every `/health`. A replica that exits or
never answers stops all of them and raises one line naming the replica and the server's own error. `assign(m)`
makes the last m replicas the tail pool (the router's convention), restarting only the replicas whose pool flags
change, and returns the seconds that took. `stop()` SIGTERMs every process group, then SIGKILLs after the grace
period. Thread-safe against a concurrent `stop()` (Ctrl-C during a restart): nothing is spawned after it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tailsieve.engines.launch_config import CPU_DEFAULT_ARGS, VLLM_SERVER, Device, LaunchConfig, PoolEngine, check_model
from tailsieve.errors import TailSieveError
from tailsieve.policy.step import Pool

_ERROR_LINE = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt))\b(:.*)?$")


class LaunchError(TailSieveError):
    """A replica could not be started, restarted or stopped; the message names it and the server's error."""


def port_free(host: str, port: int) -> bool:
    """True when nothing listens on (host, port) and it can be bound."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _free_port(host: str, taken: set[int]) -> int:
    while True:
        with socket.socket() as s:
            s.bind((host, 0))
            p = int(s.getsockname()[1])
        if p not in taken:
            return p


def server_error(log: Path, chars: int = 300) -> str:
    """The server's own error from its log: the last exception line (plus a pydantic detail line), else the
    last non-empty line."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    for i in range(len(lines) - 1, -1, -1):
        if _ERROR_LINE.match(lines[i].strip()) and "Warning" not in lines[i]:
            msg = lines[i].strip()
            nxt = lines[i + 1] if i + 1 < len(lines) else ""
            if "validation error" in msg and nxt.startswith("  ") and nxt.strip():
                msg += ": " + nxt.strip().split(" [type=")[0]
            return msg[:chars]
    tail = [ln.strip() for ln in lines if ln.strip()]
    return tail[-1][:chars] if tail else "(empty log)"


@dataclass(slots=True)
class Replica:
    """One server: its slot (index, port, cores/GPUs), current pool and flags, process and timings."""

    index: int
    port: int
    place: str | None
    pool: Pool
    engine: PoolEngine
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    boot_s: float = 0.0  # last start-up time (launch → /health)
    restarts: int = 0

    @property
    def url(self) -> str:
        """Base URL."""
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        """The process is running."""
        return self.proc is not None and self.proc.poll() is None

    def describe(self) -> dict[str, Any]:
        """JSON row for launch.json and tables."""
        return {"index": self.index, "url": self.url, "port": self.port, "place": self.place, "pool": self.pool.value,
                "flags": list(self.engine.flags()), "pid": self.proc.pid if self.proc else None,
                "boot_s": round(self.boot_s, 3), "restarts": self.restarts, "log": str(self.log)}


class Launcher:
    """Owns R replica process groups (see the module docstring); use as `with Launcher(cfg, logs) as la:`."""

    def __init__(self, config: LaunchConfig, log_dir: Path) -> None:
        self.config = config
        self.log_dir = log_dir
        self._lock = threading.RLock()
        self._stopping = False
        self._tmp: Path | None = None  # short TMPDIR root: vLLM's ZMQ IPC socket paths must stay under 107 chars
        self.restart_s_total = 0.0
        r, host = config.replicas, config.host
        if config.ports:
            ports = list(config.ports)
        elif config.base_port is not None:
            ports = [config.base_port + i for i in range(r)]
        else:
            ports = []
            for _ in range(r):
                ports.append(_free_port(host, set(ports)))
        m = config.tail_replicas
        self.replicas = [Replica(i, ports[i], config.place(i), Pool.TAIL if i >= r - m else Pool.BULK,
                                 config.engine(i >= r - m), log_dir / f"replica-{i}.log") for i in range(r)]

    @property
    def endpoints(self) -> list[str]:
        """Base URLs, replica 0 first (the order `rollout --endpoints` takes)."""
        return [rep.url for rep in self.replicas]

    @property
    def m(self) -> int:
        """Replicas currently in the tail pool."""
        return sum(rep.pool is Pool.TAIL for rep in self.replicas)

    def command(self, rep: Replica) -> list[str]:
        """The server command line of a replica in its current pool."""
        c = self.config
        head = list(c.command) or [sys.executable, *VLLM_SERVER]
        cmd = [*head, "--model", c.model, "--host", c.host, "--port", str(rep.port)]
        if c.served_model_name:
            cmd += ["--served-model-name", c.served_model_name]
        if c.device is Device.GPU and c.memory is not None:
            cmd += ["--gpu-memory-utilization", f"{c.memory:g}"]
        given = set(c.args) | set(rep.engine.args)
        if c.device is Device.CPU and c.cpu_defaults:
            for flag, value in CPU_DEFAULT_ARGS:
                if flag not in given:
                    cmd += [flag] if value is None else [flag, value]
        cmd += [*c.args, *rep.engine.flags()]
        if c.device is Device.CPU and rep.place is not None and shutil.which("taskset"):
            cmd = ["taskset", "-c", rep.place, *cmd]
        return cmd

    def env(self, rep: Replica) -> dict[str, str]:
        """Environment: placement, memory share, scratch caches (offline for a local model folder)."""
        c = self.config
        env = dict(os.environ, VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
        if self._tmp is not None:  # created by the first spawn, removed by stop()
            tmp = self._tmp / f"r{rep.index}"
            tmp.mkdir(parents=True, exist_ok=True)
            env["TMPDIR"] = str(tmp)
        env.setdefault("VLLM_CACHE_ROOT", str(self.log_dir / "vllm-cache"))
        if Path(c.model).expanduser().is_dir():
            env |= {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        if c.device is Device.CPU:
            if rep.place is not None:
                env["VLLM_CPU_OMP_THREADS_BIND"] = rep.place
            if c.memory is not None:
                env["VLLM_CPU_KVCACHE_SPACE"] = str(int(c.memory))
        elif rep.place is not None:
            env["CUDA_VISIBLE_DEVICES"] = rep.place
        return env | dict(c.env)

    # ---- start / stop -------------------------------------------------------------------------------------
    def start(self) -> Launcher:
        """Check, launch every replica, wait for every /health; on any failure stop all and raise `LaunchError`."""
        check_model(self.config.model)
        for rep in self.replicas:
            if not port_free(self.config.host, rep.port):
                raise LaunchError(f"port {rep.port} (replica {rep.index}) is in use")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for rep in self.replicas:
            rep.log.unlink(missing_ok=True)
        try:
            self._boot(self.replicas)
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, rep: Replica) -> None:
        with self._lock:
            if self._stopping:
                raise LaunchError("launcher is stopping")
            if self._tmp is None:
                base = tempfile.gettempdir()
                self._tmp = Path(tempfile.mkdtemp(prefix="tailsieve-", dir=base if len(base) <= 40 else "/tmp"))
            with rep.log.open("ab") as log:
                log.write(f"\n== tailsieve launch: {' '.join(self.command(rep))}\n".encode())
                log.flush()
                rep.proc = subprocess.Popen(self.command(rep), env=self.env(rep), stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)

    def _boot(self, reps: Sequence[Replica]) -> None:
        """Spawn `reps` and wait until all answer /health (or one fails: `LaunchError`)."""
        t0 = time.monotonic()
        for rep in reps:
            self._spawn(rep)
        waiting = list(reps)
        deadline = t0 + self.config.startup_timeout_s
        while waiting:
            for rep in list(waiting):
                if self._stopping:
                    raise LaunchError("launcher stopped during start-up")
                assert rep.proc is not None
                code = rep.proc.poll()
                if code is not None:
                    raise LaunchError(f"replica {rep.index} ({rep.pool.value} pool{self._spec_note(rep)}, port "
                                      f"{rep.port}) exited during start-up with code {code}: {server_error(rep.log)} "
                                      f"(log: {rep.log})")
                if _healthy(rep.url):
                    self._warm_up(rep)
                    rep.boot_s = time.monotonic() - t0
                    waiting.remove(rep)
            if waiting and time.monotonic() > deadline:
                rep = waiting[0]
                raise LaunchError(f"replica {rep.index} (port {rep.port}) not healthy after "
                                  f"{self.config.startup_timeout_s:.0f}s: {server_error(rep.log)} (log: {rep.log})")
            if waiting:
                time.sleep(0.25)

    def _warm_up(self, rep: Replica) -> None:
        """One short generation right after /health: a fresh server's first batch is several times slower (CPU
        vLLM with ngram: 1.16 s against 0.20 s for 8 × 256 tokens), which would otherwise land in the next step
        instead of the start-up. Servers that want an API key (401/403) are left cold."""
        c = self.config
        if c.warmup_tokens <= 0:
            return
        body = json.dumps({"model": c.served_model_name or c.model, "prompt": "Hello", "max_tokens": c.warmup_tokens,
                           "temperature": 0.0, "ignore_eos": True}).encode()
        req = urllib.request.Request(f"{rep.url}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=max(30.0, c.startup_timeout_s / 4)) as r:
                r.read()
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403):
                return
            raise LaunchError(f"replica {rep.index} (port {rep.port}) is healthy but failed its warm-up generation: "
                              f"HTTP {exc.code} {exc.reason} (log: {rep.log})") from None
        except OSError as exc:
            raise LaunchError(f"replica {rep.index} (port {rep.port}) is healthy but failed its warm-up generation: "
                              f"{exc} (log: {rep.log})") from None

    @staticmethod
    def _spec_note(rep: Replica) -> str:
        sc = rep.engine.speculative_config()
        return f", speculative {sc['method']}" if sc else ""

    def request_stop(self) -> None:
        """Make any wait for start-up give up and forbid new spawns (signal-safe: no waiting); then call `stop`."""
        self._stopping = True

    def stop(self) -> None:
        """SIGTERM every replica's process group, SIGKILL what is left after the grace period; idempotent."""
        with self._lock:
            self._stopping = True
            procs = [rep.proc for rep in self.replicas if rep.proc is not None]
        _terminate(procs, self.config.grace_s)
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def dead(self) -> list[Replica]:
        """Replicas whose process has exited (while they should be serving)."""
        return [rep for rep in self.replicas if rep.proc is not None and not rep.alive()]

    def __enter__(self) -> Launcher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- pools ----------------------------------------------------------------------------------------------
    def assign(self, m: int) -> float:
        """Make the last m replicas the tail pool; restart those whose flags change. Returns the seconds spent."""
        r = len(self.replicas)
        if not 0 <= m <= max(r - 1, 0):
            raise LaunchError(f"tail replicas m must lie in [0, {max(r - 1, 0)}], got {m}")
        pools = [Pool.TAIL if i >= r - m else Pool.BULK for i in range(r)]
        return self.configure(pools, [self.config.engine(p is Pool.TAIL) for p in pools])

    def configure(self, pools: Sequence[Pool], engines: Sequence[PoolEngine]) -> float:
        """Give replica i pool `pools[i]` and flags `engines[i]`, restarting (in parallel) only the replicas whose
        flags change; returns the wall seconds of the restarts (0.0 when none)."""
        if len(pools) != len(self.replicas) or len(engines) != len(self.replicas):
            raise LaunchError(f"configure: need {len(self.replicas)} pools and engines")
        moved = [rep for rep, e in zip(self.replicas, engines, strict=True) if e.flags() != rep.engine.flags()]
        for rep, pool, e in zip(self.replicas, pools, engines, strict=True):
            rep.pool, rep.engine = pool, e
        if not moved:
            return 0.0
        t0 = time.monotonic()
        _terminate([rep.proc for rep in moved if rep.proc is not None], self.config.grace_s)
        for rep in moved:
            rep.restarts += 1
            if not _wait_port(self.config.host, rep.port, 10.0):
                raise LaunchError(f"port {rep.port} (replica {rep.index}) still in use after its server stopped")
        self._boot(moved)
        spent = time.monotonic() - t0
        self.restart_s_total += spent
        return spent

    def describe(self) -> dict[str, Any]:
        """JSON for launch.json: the config's essentials and every replica."""
        c = self.config
        return {"model": c.model, "device": c.device.value, "replicas": [rep.describe() for rep in self.replicas],
                "endpoints": self.endpoints, "tail_replicas": self.m, "memory": c.memory,
                "tail": {"speculative_config": c.tail.speculative_config(), "args": list(c.tail.args)},
                "bulk": {"speculative_config": c.bulk.speculative_config(), "args": list(c.bulk.args)},
                "restart_free": c.restart_free}


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return int(r.status) == 200
    except OSError:
        return False


def _wait_port(host: str, port: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not port_free(host, port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _terminate(procs: Sequence[subprocess.Popen[bytes]], grace_s: float) -> None:
    """SIGTERM each process group, wait up to `grace_s` for all of them (leaders and children), SIGKILL the rest."""
    for p in procs:
        if p.poll() is None or _group_alive(p.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        for p in procs:
            p.poll()
        if not any(_group_alive(p.pid) for p in procs):
            break
        time.sleep(0.1)
    for p in procs:
        if _group_alive(p.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=10)
