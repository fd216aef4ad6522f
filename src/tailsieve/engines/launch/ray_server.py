"""`ReplicaServer`: the body of a replica's Ray actor (`RayLauncher`). It runs on the replica's node, picks a free
port there, and spawns, polls, stops and kills one engine server as its own process group. On the driver,
`RayReplica` is a replica with its node, actor and placement group, and `RayActors` is the `ServerSite` the Ray
launcher's `Serving` starts servers through (each call goes to the replica's actor)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tailsieve.engines.launch.base import LaunchError
from tailsieve.engines.launch.process import (
    exit_how,
    group_alive,
    kill_groups,
    pick_port,
    port_free,
    server_error,
    terminate,
    wait_group_gone,
)
from tailsieve.engines.launch.serving import Replica, ServedLauncher
from tailsieve.redact import shown_args

ACTOR_GONE = -1000  # `poll` of a replica whose actor died


@dataclass(slots=True, kw_only=True)
class RayReplica(Replica):
    """One replica on the cluster: its node IP, actor and placement group on top of a local `Replica`."""

    host: str = ""
    actor: Any = None
    pg: Any = None
    pid: int | None = None
    exit_code: int | None = None

    @property
    def url(self) -> str:
        """Base URL on the replica's node."""
        return f"http://{self.host or '127.0.0.1'}:{self.port}"

    def describe(self) -> dict[str, Any]:
        """JSON row for launch.json and tables."""
        return {"index": self.index, "url": self.url, "host": self.host, "port": self.port, "place": self.place,
                "pool": self.pool.value, "flags": shown_args(self.engine.flags()), "pid": self.pid,
                "boot_s": round(self.boot_s, 3), "restarts": self.restarts, "log": str(self.log)}




class ReplicaServer:
    """The body of a replica's Ray actor: spawns, polls and stops one engine server process group on its node."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.tmp: Path | None = None  # the server's TMPDIR on this node (removed by `stop(cleanup=True)`)

    def node_ip(self) -> str:
        """The IP address Ray knows this node by (where the server binds)."""
        import ray

        ip: Callable[[], object] = ray.util.get_node_ip_address  # untyped in ray, Any without it: one type here
        return str(ip())

    def free_port(self, host: str, port: int | None = None) -> int:
        """`port` when it can be bound on this node, else a free one."""
        return port if port is not None and port_free(host, port) else pick_port(host)

    def spawn(self, cmd: list[str], env: dict[str, str], log: str) -> int:
        """Start the server (own process group, output to `log` on this node); returns its pid."""
        self.stop(5.0)
        full = dict(os.environ) | env
        if "TMPDIR" in env:
            self.tmp = Path(env["TMPDIR"])
            self.tmp.mkdir(parents=True, exist_ok=True)
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as f:
            f.write(f"\n== tailsieve ray launch: {' '.join(cmd)}\n".encode())
            f.flush()
            self.proc = subprocess.Popen(cmd, env=full, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        return self.proc.pid

    def poll(self) -> int | None:
        """The server's exit code, None while it runs (or before the first spawn)."""
        return None if self.proc is None else self.proc.poll()

    def stop(self, grace_s: float, cleanup: bool = False) -> None:
        """SIGTERM the server's process group, SIGKILL after `grace_s`; `cleanup`: remove its TMPDIR too."""
        if self.proc is not None:
            terminate([self.proc], grace_s)
        if cleanup and self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            with contextlib.suppress(OSError):
                self.tmp.parent.rmdir()  # the launcher's scratch root, once every replica's folder is gone

    def kill(self) -> None:
        """SIGKILL the server's process group at once (a crash, for fault tests)."""
        if self.proc is not None:
            kill_groups([self.proc])

    def reap(self, pgid: int | None) -> None:
        """SIGKILL the process group of a server whose actor died before this one (it outlives its actor)."""
        if pgid is not None and group_alive(pgid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
            wait_group_gone(pgid, 10.0)

    def error(self, log: str, last_line: bool = True) -> str:
        """The server's own error line from its log (see `server_error`)."""
        return server_error(Path(log), last_line=last_line)


class RayActors:
    """The `ServerSite` of Ray replicas: each server spawned, polled and read by its replica's actor."""

    def __init__(self, launcher: ServedLauncher[RayReplica]) -> None:
        self.launcher = launcher

    def spawn(self, rep: Replica) -> None:
        """Spawn the server through its actor, with the launcher's environment less the driver's own."""
        import ray

        assert isinstance(rep, RayReplica)
        sv = self.launcher.serving
        with sv.lock:
            if sv.stopping:
                raise LaunchError("launcher is stopping")
            if sv.tmp is None:
                sv.tmp = Path("/tmp") / f"tailsieve-ray-{os.getpid()}-{id(self.launcher) % 100000}"
        rep.exit_code = None
        env = {k: v for k, v in self.launcher.env(rep).items() if os.environ.get(k) != v}
        rep.pid = ray.get(rep.actor.spawn.remote(self.launcher.command(rep), env, str(rep.log)), timeout=60)

    def poll(self, rep: Replica) -> int | None:
        """The server's exit code (`ACTOR_GONE` when its actor is gone), None while it runs."""
        import ray

        assert isinstance(rep, RayReplica)
        try:
            code = ray.get(rep.actor.poll.remote(), timeout=30)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return ACTOR_GONE
        return None if code is None else int(code)

    def error(self, rep: Replica, last_line: bool = True) -> str:
        """The server's error line, read by its actor on its node (the driver's copy of the log when that fails)."""
        import ray

        assert isinstance(rep, RayReplica)
        try:
            return str(ray.get(rep.actor.error.remote(str(rep.log), last_line), timeout=30))
        except Exception:
            return server_error(rep.log, last_line=last_line)

    def where(self, rep: Replica) -> str:
        """The replica's URL on its node."""
        return rep.url

    def how(self, code: int) -> str:
        """`ACTOR_GONE`: the actor is gone; else the server's exit code or signal."""
        return "lost its actor" if code == ACTOR_GONE else exit_how(code)
