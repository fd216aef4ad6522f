"""The replica process logic both launchers compose (`LocalLauncher`: process groups here; `RayLauncher`: one
actor per replica): each replica's command line and environment, built by its engine kind's server half
(engines/kinds/) plus the placement every kind shares (taskset, TMPDIR, offline hub, CUDA_VISIBLE_DEVICES,
`launch.env`), the start-up loop (spawn → the kind's health path → one warm-up generation, one-line errors
naming the replica and the server's own error), status events, and the stop flag.

Where a server runs is a `ServerSite`: it spawns, polls and reads the log of a replica's server, and says where
it serves and how it ended. A launcher owns a `Serving` and a site; neither inherits the other. `ServedLauncher` is
what both launchers share on top: their replicas, URLs, health, command lines and environments, written once."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from tailsieve.engines.kinds.kind import ServerLaunch
from tailsieve.engines.launch.base import LaunchError, ReplicaLauncher, ReplicaSlot
from tailsieve.engines.launch.config import Device, LaunchConfig
from tailsieve.engines.launch.process import http_healthy, warm_up_error
from tailsieve.redact import MASK, redact, secret_name, shown_args


@dataclass(slots=True, kw_only=True)
class Replica(ReplicaSlot):
    """One server: its slot (port, cores/GPUs, log) and process, with the pool bookkeeping."""

    port: int
    place: str | None
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    state: str = "down"  # up | restarting | failed (gave up after its retries) | down (not started / stopped)

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
                "flags": shown_args(self.engine.flags()), "pid": self.proc.pid if self.proc else None,
                "boot_s": round(self.boot_s, 3), "restarts": self.restarts, "state": self.state, "log": str(self.log)}


class ServerSite(Protocol):
    """Where a launcher's servers run: the hooks of the start-up loop."""

    def spawn(self, rep: Replica) -> None:
        """Start the replica's server (its command line and environment from `Serving`)."""

    def poll(self, rep: Replica) -> int | None:
        """The server's exit code, None while it runs."""

    def where(self, rep: Replica) -> str:
        """Where the replica serves, for messages."""

    def how(self, code: int) -> str:
        """How a server ended, from its exit code."""

    def error(self, rep: Replica, last_line: bool = True) -> str:
        """The server's own error line from its log."""


class Serving:
    """Commands, environment, start-up and events of one launcher's replicas (see the module docstring)."""

    def __init__(self, owner: ReplicaLauncher, site: ServerSite) -> None:
        self.owner = owner  # its `config` may change (a reload by restart): read it each time
        self.site = site
        self.lock = threading.RLock()
        self.stopping = False  # set by `request_stop` / the launcher's stop: no spawn after it
        self.tmp: Path | None = None  # short TMPDIR root: vLLM's ZMQ IPC socket paths must stay under 107 chars
        self.events: list[str] = []

    @property
    def config(self) -> LaunchConfig:
        """The owner's launch config."""
        return self.owner.config

    def launch(self, rep: Replica, host: str | None = None, port: str | None = None) -> ServerLaunch:
        """What the replica's server is started with (host and port: the config's host and the replica's port)."""
        c = self.config
        return ServerLaunch(model=c.model, host=c.host if host is None else host,
                            port=str(rep.port) if port is None else port, device=c.device, place=rep.place,
                            memory=c.memory, served_model_name=c.served_model_name, args=c.args,
                            pool_args=rep.engine.args, pool_flags=rep.engine.flags(), cpu_defaults=c.cpu_defaults,
                            weight_reload=c.weight_reload, cache_dir=str(self.owner.log_dir / "vllm-cache"))

    def command(self, rep: Replica, host: str | None = None, port: str | None = None) -> list[str]:
        """The server command line of a replica in its current pool (pinned with taskset on cpu)."""
        c = self.config
        server = c.engine_kind.server
        cmd = server.command(self.launch(rep, host, port), tuple(c.command) or server.default_command())
        if c.device is Device.CPU and rep.place is not None and shutil.which("taskset"):
            cmd = ["taskset", "-c", rep.place, *cmd]
        return cmd

    def env(self, rep: Replica) -> dict[str, str]:
        """Environment: the kind's variables (placement, memory, caches), TMPDIR, the hub offline for a local model
        folder, CUDA_VISIBLE_DEVICES on gpu, then `launch.env`."""
        c = self.config
        env = dict(os.environ)
        if self.tmp is not None:  # created by the first spawn, removed by stop()
            tmp = self.tmp / f"r{rep.index}"
            tmp.mkdir(parents=True, exist_ok=True)
            env["TMPDIR"] = str(tmp)
        env |= c.engine_kind.server.env(self.launch(rep), os.environ)
        if Path(c.model).expanduser().is_dir():
            env |= {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        if c.device is Device.GPU and rep.place is not None:
            env["CUDA_VISIBLE_DEVICES"] = rep.place
        return env | dict(c.env)

    def shown_env(self, rep: Replica) -> str:
        """The environment a dry run prints: the kind's variables (its `shown_env` prefixes) and every `launch.env`
        variable, sorted, as NAME=value, shell-quoted; a secret-looking name's value is `[redacted]`, and any
        credential-shaped text in a value too."""
        shown, given = self.config.engine_kind.server.shown_env, {k for k, _ in self.config.env}
        return " ".join(f"{k}={MASK if secret_name(k) else shlex.quote(redact(v))}"
                        for k, v in sorted(self.env(rep).items()) if k.startswith(shown) or k in given)

    def healthy(self, rep: Replica) -> bool:
        """The kind's health path of the replica answers 200."""
        return http_healthy(rep.url, path=self.config.engine_kind.server.health_path)

    # ---- start-up -------------------------------------------------------------------------------------------
    def boot(self, reps: Sequence[Replica]) -> None:
        """Spawn `reps` and wait until all answer their health path and a warm-up (or one fails: `LaunchError`)."""
        t0 = time.monotonic()
        for rep in reps:
            self.site.spawn(rep)
        waiting = list(reps)
        deadline = t0 + self.config.startup_timeout_s
        while waiting:
            for rep in list(waiting):
                if self.stopping:
                    raise LaunchError("launcher stopped during start-up")
                code = self.site.poll(rep)
                if code is not None:
                    raise LaunchError(f"replica {rep.index} ({rep.pool.value} pool{self.spec_note(rep)}, "
                                      f"{self.site.where(rep)}) {self.site.how(code)} during start-up: "
                                      f"{self.site.error(rep)} (log: {rep.log})")
                if self.healthy(rep):
                    self.warm_up(rep)
                    rep.boot_s = time.monotonic() - t0
                    rep.state = "up"
                    waiting.remove(rep)
            if waiting and time.monotonic() > deadline:
                rep = waiting[0]
                raise LaunchError(f"replica {rep.index} ({self.site.where(rep)}) not healthy after "
                                  f"{self.config.startup_timeout_s:.0f}s: {self.site.error(rep)} (log: {rep.log})")
            if waiting:
                time.sleep(0.25)

    def warm_up(self, rep: Replica) -> None:
        """One short generation right after health (`process.warm_up_error`); a failure is a `LaunchError`."""
        c = self.config
        err = warm_up_error(rep.url, c.served_model_name or c.model, c.warmup_tokens,
                            max(30.0, c.startup_timeout_s / 4))
        if err is not None:
            raise LaunchError(f"replica {rep.index} ({self.site.where(rep)}) is healthy but failed its warm-up "
                              f"generation: {err} (log: {rep.log})")

    @staticmethod
    def spec_note(rep: Replica) -> str:
        """`, speculative METHOD` for a speculating replica's messages."""
        sc = rep.engine.speculative_config()
        return f", speculative {sc['method']}" if sc else ""

    # ---- events -------------------------------------------------------------------------------------------------
    def event(self, line: str) -> None:
        """Queue a status line."""
        with self.lock:
            self.events.append(line)

    def drain(self) -> list[str]:
        """Status lines since the last call."""
        with self.lock:
            out, self.events = self.events, []
        return out


R = TypeVar("R", bound=Replica)


class ServedLauncher(ReplicaLauncher, Generic[R]):
    """A launcher whose replicas' servers a `Serving` runs (`LocalLauncher`: local process groups; `RayLauncher`:
    Ray actors): the replica list and what is read off it, once for both."""

    serving: Serving
    replicas: list[R]

    @property
    def slots(self) -> Sequence[R]:
        """The replicas, replica 0 first."""
        return self.replicas

    @property
    def endpoints(self) -> list[str]:
        """Base URLs, replica 0 first (the order `rollout --endpoints` takes)."""
        return [rep.url for rep in self.replicas]

    def healthy(self, i: int) -> bool:
        """Replica i's health path (the engine kind's, `/health`) answers 200."""
        return self.serving.healthy(self.replicas[i])

    def command(self, rep: Replica) -> list[str]:
        """The server command line of a replica in its current pool."""
        return self.serving.command(rep)

    def env(self, rep: Replica) -> dict[str, str]:
        """Environment: the kind's placement, memory share and caches, scratch, offline for a local model folder (on
        Ray: the driver's view; the replica's actor sends the part the driver lacks)."""
        return self.serving.env(rep)
