"""`ReplicaServer`: the body of a replica's Ray actor (`RayLauncher`). It runs on the replica's node, picks a free
port there, and spawns, polls, stops and kills one engine server as its own process group."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from pathlib import Path

from tailsieve.engines.launch.process import (
    group_alive,
    kill_groups,
    pick_port,
    port_free,
    server_error,
    terminate,
    wait_group_gone,
)


class ReplicaServer:
    """The body of a replica's Ray actor: spawns, polls and stops one engine server process group on its node."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.tmp: Path | None = None  # the server's TMPDIR on this node (removed by `stop(cleanup=True)`)

    def node_ip(self) -> str:
        """The IP address Ray knows this node by (where the server binds)."""
        import ray

        return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]

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
