"""`LocalLauncher` (registered as `local`): R replicas of one engine kind (vLLM by default) on this machine, one
process group each, started together, health-checked, restarted in place when their pool's flags change, and
stopped cleanly. Commands, environment and the start-up loop come from `Serving` (launch/serving.py, shared with
the Ray launcher); `LocalProcesses` is where the servers run here: child process groups.

`start()` checks the model path and the ports, launches every replica (CPU: `taskset -c CORES` and the kind's core
binding, e.g. `VLLM_CPU_OMP_THREADS_BIND`; GPU: `CUDA_VISIBLE_DEVICES`), then waits for every health check (the
kind's path, `/health`) and a short warm-up generation. A replica that exits or never answers during `start()` stops
all of them and raises one line naming the replica and the server's own error. Once started, a watcher thread polls
every replica's process: one that dies while serving has its whole process group killed (vLLM's engine-core and
worker processes are not left behind), and is restarted in place (same port and cores) by its own thread with
bounded retries and back-off (`restart_retries`, `restart_backoff_s`), never stopping the others; status lines
(`drain_events`) name the replica, its exit code or signal and the server's error. `stop()` SIGTERMs every process
group, then SIGKILLs after the grace period; `kill(i)` SIGKILLs one replica's group at once (a crash, for fault
tests). Thread-safe against a concurrent `stop()` (Ctrl-C during a restart): nothing is spawned after it.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

from tailsieve.engines.launch.base import (
    LaunchError,
    initial_pools,
    register_launcher,
)
from tailsieve.engines.launch.config import LaunchConfig, check_model
from tailsieve.engines.launch.process import (
    exit_how,
    kill_groups,
    pick_port,
    port_free,
    server_error,
    terminate,
    wait_group_gone,
    wait_port,
)
from tailsieve.engines.launch.restart import RestartPolicy
from tailsieve.engines.launch.serving import Replica, ServedLauncher, Serving
from tailsieve.policy.step import Pool
from tailsieve.redact import shown_command

__all__ = ["LocalLauncher", "LocalProcesses", "Replica"]


def _ports(config: LaunchConfig) -> list[int]:
    if config.ports:
        return list(config.ports)
    if config.base_port is not None:
        return [config.base_port + i for i in range(config.replicas)]
    ports: list[int] = []
    for _ in range(config.replicas):
        ports.append(pick_port(config.host, set(ports)))
    return ports


class LocalProcesses:
    """The `ServerSite` of local replicas: each server a child process group writing its log here."""

    def __init__(self, launcher: LocalLauncher) -> None:
        self.launcher = launcher

    def spawn(self, rep: Replica) -> None:
        """Start the replica's server as its own process group (after the launcher's start header in its log)."""
        sv = self.launcher.serving
        with sv.lock:
            if sv.stopping:
                raise LaunchError("launcher is stopping")
            if sv.tmp is None:
                base = tempfile.gettempdir()
                sv.tmp = Path(tempfile.mkdtemp(prefix="tailsieve-", dir=base if len(base) <= 40 else "/tmp"))
            with rep.log.open("ab") as log:
                log.write(f"\n== tailsieve launch: {shown_command(sv.command(rep))}\n".encode())
                log.flush()
                rep.proc = subprocess.Popen(sv.command(rep), env=sv.env(rep), stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)

    def poll(self, rep: Replica) -> int | None:
        """The server's exit code, None while it runs."""
        return None if rep.proc is None else rep.proc.poll()

    def where(self, rep: Replica) -> str:
        """`port N`."""
        return f"port {rep.port}"

    def how(self, code: int) -> str:
        """The exit code or signal in words."""
        return exit_how(code)

    def error(self, rep: Replica, last_line: bool = True) -> str:
        """The server's own error line from its log."""
        return server_error(rep.log, last_line=last_line)


@register_launcher("local")
class LocalLauncher(ServedLauncher[Replica]):
    """Owns R local replica process groups (see the module docstring)."""

    def __init__(self, config: LaunchConfig, log_dir: Path) -> None:
        super().__init__(config, log_dir)
        self.serving = Serving(self, LocalProcesses(self))
        self._halt = threading.Event()  # set by stop(): the watcher and the recoveries give up their waits
        self._busy: set[int] = set()  # replicas being restarted (watcher or pool move): the watcher leaves them be
        self._watcher: threading.Thread | None = None
        self.watch_interval_s = 0.25
        self.recoveries: list[dict[str, Any]] = []  # one row per death: the kill → restart → back timeline
        ports = _ports(config)
        self.replicas = [Replica(index=i, port=ports[i], place=config.place(i), pool=pool,
                                 engine=config.engine(pool is Pool.TAIL), log=log_dir / f"replica-{i}.log")
                         for i, pool in enumerate(initial_pools(config))]

    @property
    def _lock(self) -> threading.RLock:
        return self.serving.lock

    @property
    def _stopping(self) -> bool:
        return self.serving.stopping

    def dry_run(self) -> list[str]:
        """Each replica's placement environment and command line."""
        lines = []
        for rep in self.replicas:
            lines.append(f"# replica {rep.index} ({rep.pool.value}) {rep.url}  env: {self.serving.shown_env(rep)}")
            lines.append(shown_command(self.command(rep)))
        return lines

    # ---- start / stop -------------------------------------------------------------------------------------
    def start(self) -> Self:
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
        with self._lock:
            if not self._stopping and self._watcher is None:
                self._watcher = threading.Thread(target=self._watch, name="tailsieve-replica-watch", daemon=True)
                self._watcher.start()
        return self

    def _boot(self, reps: Sequence[Replica]) -> None:
        """Spawn `reps` and wait until all answer /health (or one fails: `LaunchError`)."""
        self.serving.boot(reps)

    def _warm_up(self, rep: Replica) -> None:
        """One short generation right after /health (`Serving.warm_up`)."""
        self.serving.warm_up(rep)

    def request_stop(self) -> None:
        """Make any wait for start-up give up and forbid new spawns (signal-safe: no waiting); then call `stop`."""
        self.serving.stopping = True

    def stop(self) -> None:
        """SIGTERM every replica's process group, SIGKILL what is left after the grace period; idempotent."""
        with self._lock:
            self.serving.stopping = True
            self._halt.set()
            procs = [rep.proc for rep in self.replicas if rep.proc is not None]
        terminate(procs, self.config.grace_s)
        for rep in self.replicas:
            rep.state = "down"
        if self.serving.tmp is not None:
            shutil.rmtree(self.serving.tmp, ignore_errors=True)

    def kill(self, i: int) -> None:
        """SIGKILL replica i's whole process group at once (a crash, for fault tests); the watcher restarts it."""
        proc = self.replicas[i].proc
        if proc is not None:
            kill_groups([proc])
            wait_group_gone(proc.pid)

    def dead(self) -> list[Replica]:
        """Replicas whose process has exited (while they should be serving)."""
        return [rep for rep in self.replicas if rep.proc is not None and not rep.alive()]

    def failure(self) -> str | None:
        """One line when every replica died and none could be restarted (the launcher can serve no more)."""
        if not self.replicas or any(rep.state != "failed" for rep in self.replicas):
            return None
        return "every replica died and could not be restarted: " + "; ".join(
            f"replica {rep.index}: {exit_how(rep.proc.returncode if rep.proc else None)}" for rep in self.replicas)

    def drain_events(self) -> list[str]:
        """Status lines since the last call: deaths (exit code or signal, server error), restarts, returns."""
        return self.serving.drain()

    def _event(self, line: str) -> None:
        self.serving.event(line)

    # ---- the watcher: a replica that dies while serving is reaped and restarted in place ------------------------
    def _watch(self) -> None:
        while not self._halt.is_set():
            for rep in self.replicas:
                with self._lock:
                    if self._stopping or rep.index in self._busy or rep.state != "up" or rep.proc is None \
                            or rep.proc.poll() is None:
                        continue
                    self._busy.add(rep.index)
                    rep.state = "restarting"
                threading.Thread(target=self._recover, args=(rep,), name=f"tailsieve-recover-{rep.index}",
                                 daemon=True).start()
            self._halt.wait(self.watch_interval_s)

    def _recover(self, rep: Replica) -> None:
        """Reap the dead replica's whole process group, then restart it with back-off, up to `restart_retries`."""
        try:
            self._recover_inner(rep)
        finally:
            with self._lock:
                self._busy.discard(rep.index)

    def _recover_inner(self, rep: Replica) -> None:
        assert rep.proc is not None
        t_dead = time.monotonic()
        pid, how = rep.proc.pid, exit_how(rep.proc.returncode)
        kill_groups([rep.proc])  # the engine core and workers share the server's process group
        reaped = wait_group_gone(pid, 10.0)
        c, policy = self.config, RestartPolicy.of(self.config)
        self._event(policy.death(f"replica {rep.index} ({rep.pool.value} pool, port {rep.port}, pid {pid})", how,
                                 server_error(rep.log, last_line=False), rep.log,
                                 f"process group {'reaped' if reaped else 'NOT reaped'}"))
        row: dict[str, Any] = {"replica": rep.index, "pid": pid, "how": how, "reaped": reaped, "attempts": 0}
        self.recoveries.append(row)
        for attempt in range(1, c.restart_retries + 1):
            if self._halt.wait(policy.delay_s(attempt)) or self._stopping:
                return
            row["attempts"] = attempt
            try:
                if not wait_port(c.host, rep.port, 10.0):
                    raise LaunchError(f"port {rep.port} still in use")
                rep.restarts += 1
                t_boot = time.monotonic()
                self._boot([rep])
            except LaunchError as exc:
                if self._stopping:
                    return
                if rep.proc is not None:
                    kill_groups([rep.proc])
                    wait_group_gone(rep.proc.pid)
                self._event(policy.failed_try(rep.index, attempt, exc))
                continue
            row |= {"restart_began_s": round(t_boot - t_dead, 3), "back_s": round(time.monotonic() - t_dead, 3),
                    "boot_s": round(rep.boot_s, 3), "new_pid": rep.proc.pid if rep.proc else None}
            self._event(policy.back(f"replica {rep.index} (port {rep.port})", row["back_s"], attempt, rep.boot_s))
            return
        rep.state = "failed"
        self._event(policy.stays_down(f"replica {rep.index} (port {rep.port})", c.restart_retries))

    def describe(self) -> dict[str, Any]:
        """The launcher's JSON (see `ReplicaLauncher.describe`) with every death's recovery timeline."""
        return super().describe() | {"recoveries": [dict(r) for r in self.recoveries]}

    # ---- restarts ---------------------------------------------------------------------------------------------
    def _relaunch(self, indices: Sequence[int]) -> None:
        """SIGTERM these replicas' groups, wait for their ports, start them again with their current flags (after
        any restart of theirs the watcher is running)."""
        moved = [self.replicas[i] for i in indices]
        while True:
            with self._lock:
                if self._stopping:
                    raise LaunchError("launcher is stopping")
                if not any(rep.index in self._busy for rep in moved):
                    self._busy.update(rep.index for rep in moved)
                    for rep in moved:
                        rep.state = "restarting"
                    break
            time.sleep(0.1)
        try:
            terminate([rep.proc for rep in moved if rep.proc is not None], self.config.grace_s)
            for rep in moved:
                if not wait_port(self.config.host, rep.port, 10.0):
                    raise LaunchError(f"port {rep.port} (replica {rep.index}) still in use after its server stopped")
            self._boot(moved)
        finally:
            with self._lock:
                self._busy.difference_update(rep.index for rep in moved)
                for rep in moved:  # a failed restart: the watcher takes over once the process is gone
                    if rep.state == "restarting" and rep.proc is not None and not self._stopping:
                        rep.state = "up"
