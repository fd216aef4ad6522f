"""`RayLauncher` (registered as `ray`): R vLLM replicas on a Ray cluster, one placement group and one actor per
replica. The actor runs on its bundle's node, picks a free port there and spawns the same server command line as
`LocalLauncher.command` (bound to the node's IP) as its own process group; the driver health-checks
`http://NODE_IP:PORT` and keeps the router and controller. Pool moves restart the server in place (same actor, same
port). A watchdog thread restarts a server that exits, or an actor that dies, on the same port with the local
launcher's `RestartPolicy` (`restart_retries` tries, the first at once, then `restart_backoff_s` · 2^(k−2) s, at most
30 s; status lines through `drain_events`), while the step loop re-dispatches the lost requests and readmits the
replica when `/health` answers.
One replica's death never stops the others: `failure()` speaks only when every replica has given up.

`ray` is imported lazily (install the `ray` extra: `pip install 'tailsieve[ray]'`). The cluster address comes from
`LaunchConfig.ray` (`auto`, or `HOST:PORT`); a driver that already called `ray.init` keeps its own connection.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from tailsieve.engines.launch.base import LaunchError, register_launcher
from tailsieve.engines.launch.config import Device, LaunchConfig, check_model
from tailsieve.engines.launch.local_launcher import LocalLauncher, Replica
from tailsieve.engines.launch.process import (
    exit_how,
    server_error,
)
from tailsieve.engines.launch.ray_server import ReplicaServer
from tailsieve.engines.launch.restart import RestartPolicy

_TP = re.compile(r"^(--tensor-parallel-size|-tp)(=(\d+))?$")


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
                "pool": self.pool.value, "flags": list(self.engine.flags()), "pid": self.pid,
                "boot_s": round(self.boot_s, 3), "restarts": self.restarts, "log": str(self.log)}


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """A `HOST:PORT` cluster address must accept a TCP connection (Ray itself retries for minutes); `auto` and
    `ray://` client addresses are left to Ray."""
    host, sep, port = address.rpartition(":")
    if address == "auto" or address.startswith("ray://") or not sep or not port.isdigit():
        return
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        raise LaunchError(f"the Ray cluster at {address} is not reachable ({exc.strerror or exc}); start it with "
                          "`ray start --head --port=PORT` or pass --ray auto on a cluster node") from None


def tensor_parallel(config: LaunchConfig) -> int:
    """The `--tensor-parallel-size` in the config's server flags (1 when absent)."""
    args = list(config.args)
    for k, a in enumerate(args):
        m = _TP.match(a)
        if m:
            v = m.group(3) or (args[k + 1] if k + 1 < len(args) else "1")
            return max(1, int(v)) if v.isdigit() else 1
    return 1


def bundle(config: LaunchConfig, i: int) -> dict[str, float]:
    """Replica i's placement-group bundle: CPUs (one per core in its core list, else 1), plus its
    tensor-parallel GPUs on a GPU fleet."""
    place = config.places[i] if config.places else None
    cpus = 1.0
    if config.device is Device.CPU and place:
        cpus = float(sum(len(range(int(a), int(b.split(":")[0]) + 1)) if "-" in p else 1
                         for p in place.split(",") for a, _, b in [p.partition("-")]))
    out = {"CPU": cpus}
    if config.device is Device.GPU:
        out["GPU"] = float(tensor_parallel(config))
    return out


@register_launcher("ray")
class RayLauncher(LocalLauncher):
    """R replicas as Ray actors in their own placement groups (see the module docstring)."""

    def __init__(self, config: LaunchConfig, log_dir: Path) -> None:
        super().__init__(config, log_dir)
        self.replicas: list[RayReplica] = [  # type: ignore[assignment]
            RayReplica(index=r.index, port=r.port if config.ports or config.base_port else 0,
                       place=r.place if config.places else None, pool=r.pool, engine=r.engine, log=r.log)
            for r in self.replicas]
        self._own_ray = False
        self._busy: set[int] = set()  # replicas a pool move or the watchdog is restarting
        self._failed: dict[int, str] = {}
        self._watchdog_thread: threading.Thread | None = None
        self._wake = threading.Event()

    @property
    def slots(self) -> Sequence[RayReplica]:
        """The replicas, replica 0 first."""
        return self.replicas

    def command(self, rep: Replica) -> list[str]:
        """`LocalLauncher.command`, bound to the replica's node IP."""
        cmd = LocalLauncher.command(self, rep)
        k = cmd.index("--host")
        cmd[k + 1] = rep.host if isinstance(rep, RayReplica) and rep.host else self.config.host
        return cmd

    def _extra_env(self, rep: Replica) -> dict[str, str]:
        """The launcher's environment for a replica less the driver's own (the actor adds its node's)."""
        return {k: v for k, v in self.env(rep).items() if os.environ.get(k) != v}

    def dry_run(self) -> list[str]:
        """The cluster, each replica's bundle and command line (host and port are chosen on the node)."""
        lines = [f"# ray cluster: {self.config.ray or 'auto'}"]
        for rep in self.replicas:
            b = bundle(self.config, rep.index)
            lines.append(f"# replica {rep.index} ({rep.pool.value}) placement group bundle {b}")
            cmd = self.command(rep)
            k = cmd.index("--host")
            cmd[k + 1] = rep.host or "NODE_IP"
            cmd[k + 3] = str(rep.port) if rep.port else "FREE_PORT"
            lines.append(" ".join(cmd))
        return lines

    # ---- start / stop -------------------------------------------------------------------------------------
    def _ray(self) -> Any:
        try:
            import ray
        except ImportError:
            raise LaunchError("the ray launcher needs Ray: pip install 'tailsieve[ray]'") from None
        if not ray.is_initialized():
            address = self.config.ray or "auto"
            check_reachable(address)
            try:
                ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise LaunchError(f"cannot join the Ray cluster at {address}: {str(exc).splitlines()[0][:200]} "
                                  "(start one with `ray start --head`, docs/multinode.md)") from None
            self._own_ray = True
        return ray

    def start(self) -> Self:
        """Connect, create every placement group and actor, spawn every server, wait for every /health."""
        check_model(self.config.model)
        ray = self._ray()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            for rep in self.replicas:
                rep.log.unlink(missing_ok=True)
                self._place(rep)
            self._boot(self.replicas)
        except BaseException:
            self.stop()
            raise
        del ray
        self._watchdog_thread = threading.Thread(target=self._watchdog, name="tailsieve-ray-watchdog", daemon=True)
        self._watchdog_thread.start()
        return self

    def _place(self, rep: RayReplica) -> None:
        """Create the replica's placement group (if needed) and actor; learn its node IP and a free port there
        (the old port when it is free: a new actor first kills the server its dead predecessor left behind)."""
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        b = bundle(self.config, rep.index)
        if rep.pg is None:
            rep.pg = placement_group([b], strategy="STRICT_PACK", name=f"tailsieve-replica-{rep.index}-{id(self)}")
            try:
                ray.get(rep.pg.ready(), timeout=self.config.startup_timeout_s)
            except ray.exceptions.GetTimeoutError:
                raise LaunchError(f"replica {rep.index}: no node offers {b} within "
                                  f"{self.config.startup_timeout_s:.0f}s (placement group pending)") from None
        actor_cls = ray.remote(ReplicaServer)
        rep.actor = actor_cls.options(
            num_cpus=b["CPU"], num_gpus=b.get("GPU", 0), max_restarts=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=rep.pg,
                                                                 placement_group_bundle_index=0)).remote()
        host = ray.get(rep.actor.node_ip.remote(), timeout=self.config.startup_timeout_s)
        if host == rep.host:
            ray.get(rep.actor.reap.remote(rep.pid), timeout=60)
        rep.host = host
        rep.port = ray.get(rep.actor.free_port.remote(rep.host, rep.port or None), timeout=60)

    def _spawn(self, rep: Replica) -> None:
        import ray

        assert isinstance(rep, RayReplica)
        with self._lock:
            if self._stopping:
                raise LaunchError("launcher is stopping")
            if self._tmp is None:
                self._tmp = Path("/tmp") / f"tailsieve-ray-{os.getpid()}-{id(self) % 100000}"
        rep.exit_code = None
        rep.pid = ray.get(rep.actor.spawn.remote(self.command(rep), self._extra_env(rep), str(rep.log)), timeout=60)

    def _poll(self, rep: Replica) -> int | None:
        """The server's exit code (-1000 when its actor is gone), None while it runs."""
        import ray

        assert isinstance(rep, RayReplica)
        try:
            code = ray.get(rep.actor.poll.remote(), timeout=30)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return -1000
        return None if code is None else int(code)

    def _error(self, rep: Replica, last_line: bool = True) -> str:
        """The server's error line, read by its actor on its node (the driver's copy of the log when that fails)."""
        import ray

        assert isinstance(rep, RayReplica)
        try:
            return str(ray.get(rep.actor.error.remote(str(rep.log), last_line), timeout=30))
        except Exception:
            return server_error(rep.log, last_line=last_line)

    def _where(self, rep: Replica) -> str:
        """The replica's URL on its node."""
        return rep.url

    def _how(self, code: int) -> str:
        """-1000: the actor is gone; else the server's exit code or signal."""
        return "lost its actor" if code == -1000 else exit_how(code)

    def stop(self) -> None:
        """Stop the watchdog, every server (SIGTERM → SIGKILL), actor and placement group; idempotent."""
        with self._lock:
            self._stopping = True
        self._wake.set()
        t = self._watchdog_thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=self.config.grace_s + 30)
        try:
            import ray
        except ImportError:
            return
        if not ray.is_initialized():
            return
        from ray.util.placement_group import remove_placement_group

        stops = []
        for rep in self.replicas:
            if rep.actor is not None:
                with contextlib.suppress(Exception):
                    stops.append(rep.actor.stop.remote(self.config.grace_s, True))
        with contextlib.suppress(Exception):
            ray.get(stops, timeout=self.config.grace_s + 30)
        for rep in self.replicas:
            if rep.actor is not None:
                with contextlib.suppress(Exception):
                    ray.kill(rep.actor)
                rep.actor = None
            if rep.pg is not None:
                with contextlib.suppress(Exception):
                    remove_placement_group(rep.pg)
                rep.pg = None
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
        if self._own_ray:
            ray.shutdown()
            self._own_ray = False

    def kill(self, i: int) -> None:
        """SIGKILL replica i's server at once (a crash, for fault tests); the watchdog restarts it."""
        import ray

        rep = self.replicas[i]
        if rep.actor is not None:
            ray.get(rep.actor.kill.remote(), timeout=30)

    def dead(self) -> list[Replica]:
        """Replicas whose automatic restarts gave up."""
        return [self.replicas[i] for i in sorted(self._failed)]

    def failure(self) -> str | None:
        """One line when every replica has given up its automatic restarts (the launcher can serve no more)."""
        if not self.replicas or len(self._failed) < len(self.replicas):
            return None
        return "every replica died and could not be restarted: " + "; ".join(
            self._failed[i] for i in sorted(self._failed))

    # ---- restarts ---------------------------------------------------------------------------------------------
    def _relaunch(self, indices: Sequence[int]) -> None:
        """Stop these replicas' servers through their actors, start them again (same node and port)."""
        import ray

        moved = [self.replicas[i] for i in indices]
        with self._lock:
            self._busy |= set(indices)
        try:
            ray.get([rep.actor.stop.remote(self.config.grace_s) for rep in moved],
                    timeout=self.config.grace_s + 30)
            for rep in moved:
                rep.port = ray.get(rep.actor.free_port.remote(rep.host, rep.port), timeout=60)
            self._boot(moved)
        finally:
            with self._lock:
                self._busy -= set(indices)

    def _watchdog(self) -> None:
        """Restart exited servers (and dead actors, on their placement group) until `stop`, with the shared
        `RestartPolicy` (the first try at once, try k after `restart_backoff_s` · 2^(k−2) s, at most 30 s)."""
        c, policy = self.config, RestartPolicy.of(self.config)
        tries: dict[int, int] = {}
        next_try: dict[int, float] = {}
        died: dict[int, tuple[float, str]] = {}
        while not self._stopping:
            self._wake.wait(0.25)
            for rep in self.replicas:
                if self._stopping:
                    return
                with self._lock:
                    if rep.index in self._busy or rep.index in self._failed:
                        continue
                code = self._poll(rep)
                if code is None:
                    continue
                now = time.monotonic()
                if rep.index not in died:
                    how = self._how(code)
                    died[rep.index] = (now, how)
                    self._event(policy.death(f"replica {rep.index} ({rep.pool.value} pool, {rep.url}, pid {rep.pid})",
                                             how, self._error(rep, last_line=False), rep.log))
                n = tries.get(rep.index, 0)
                if n >= c.restart_retries:
                    self._failed[rep.index] = f"replica {rep.index} ({rep.url}): {policy.gave_up(n)}"
                    self._event(policy.stays_down(f"replica {rep.index} ({rep.url})", n))
                    continue
                if now < next_try.get(rep.index, 0.0):
                    continue
                tries[rep.index] = n = n + 1
                with self._lock:
                    self._busy.add(rep.index)
                try:
                    if code == -1000:
                        self._place(rep)
                    else:
                        rep.port = ray_get(rep.actor.free_port.remote(rep.host, rep.port), 60)
                    rep.restarts += 1
                    self._boot([rep])
                except Exception as exc:
                    next_try[rep.index] = time.monotonic() + policy.delay_s(n + 1)
                    self._event(policy.failed_try(rep.index, n, exc))
                else:
                    t_dead, how = died.pop(rep.index)
                    back = time.monotonic() - t_dead
                    self.recoveries.append({"replica": rep.index, "how": how, "attempts": n,
                                            "back_s": round(back, 3), "boot_s": round(rep.boot_s, 3)})
                    self._event(policy.back(f"replica {rep.index} ({rep.url})", back, n, rep.boot_s))
                    tries.pop(rep.index, None)
                finally:
                    with self._lock:
                        self._busy.discard(rep.index)


def ray_get(ref: Any, timeout_s: float) -> Any:
    """`ray.get` with a timeout (ray imported lazily)."""
    import ray

    return ray.get(ref, timeout=timeout_s)
