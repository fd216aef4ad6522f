"""`RayLauncher` (registered as `ray`): R replicas of one engine kind (vLLM by default) on a Ray cluster, one
placement group and one actor per replica. It composes the local launcher's process logic (`Serving`,
launch/serving.py: the kind's command line and environment, the start-up loop, events) with `RayActors`, where the
servers run: the actor runs on its bundle's node, picks a free port there and spawns the same server command line
as the local launcher (bound to the node's IP) as its own process group; the driver health-checks
`http://NODE_IP:PORT` and keeps the router and controller. Pool moves restart the server in place (same actor, same
port). A watchdog thread restarts a server that exits, or an actor that dies, on the same port with the local
launcher's `RestartPolicy` (`restart_retries` tries, the first at once, then `restart_backoff_s` · 2^(k−2) s, at most
30 s; status lines through `drain_events`), while the step loop re-dispatches the lost requests and readmits the
replica when `/health` answers.
One replica's death never stops the others: `failure()` speaks only when every replica has given up.

`ray` is imported lazily (install the `ray` extra: `pip install -e '.[ray]'`). The cluster address comes from
`LaunchConfig.ray` (`auto`, or `HOST:PORT`); a driver that already called `ray.init` keeps its own connection.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

from tailsieve.engines.launch.base import LaunchError, initial_pools, register_launcher
from tailsieve.engines.launch.config import Device, LaunchConfig, check_model
from tailsieve.engines.launch.ray_server import ACTOR_GONE, RayActors, RayReplica, ReplicaServer
from tailsieve.engines.launch.restart import RestartPolicy
from tailsieve.engines.launch.serving import Replica, ServedLauncher, Serving
from tailsieve.policy.step import Pool
from tailsieve.redact import shown_command

__all__ = ["ACTOR_GONE", "RayActors", "RayLauncher", "RayReplica", "bundle", "check_reachable", "ray_get",
           "tensor_parallel"]
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
    """GPUs per replica: the engine kind's tensor-parallel flag in the config's server flags (1 when absent)."""
    return config.engine_kind.server.gpus(config.args)


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
class RayLauncher(ServedLauncher[RayReplica]):
    """R replicas as Ray actors in their own placement groups (see the module docstring)."""

    def __init__(self, config: LaunchConfig, log_dir: Path) -> None:
        super().__init__(config, log_dir)
        self.serving = Serving(self, RayActors(self))
        self.replicas: list[RayReplica] = [
            RayReplica(index=i, port=config.ports[i] if config.ports else
                       (config.base_port + i if config.base_port else 0),
                       place=config.places[i] if config.places else None, pool=pool,
                       engine=config.engine(pool is Pool.TAIL), log=log_dir / f"replica-{i}.log")
            for i, pool in enumerate(initial_pools(config))]
        self.recoveries: list[dict[str, Any]] = []
        self._own_ray = False
        self._busy: set[int] = set()  # replicas a pool move or the watchdog is restarting
        self._failed: dict[int, str] = {}
        self._watchdog_thread: threading.Thread | None = None
        self._wake = threading.Event()

    @property
    def _tmp(self) -> Path | None:
        return self.serving.tmp

    def command(self, rep: Replica) -> list[str]:
        """The local launcher's command line (`Serving.command`), bound to the replica's node IP."""
        host = rep.host if isinstance(rep, RayReplica) and rep.host else None
        return self.serving.command(rep, host=host)

    def dry_run(self) -> list[str]:
        """The cluster, each replica's bundle and command line (host and port are chosen on the node)."""
        lines = [f"# ray cluster: {self.config.ray or 'auto'}"]
        for rep in self.replicas:
            b = bundle(self.config, rep.index)
            env = self.serving.shown_env(rep)
            lines.append(f"# replica {rep.index} ({rep.pool.value}) placement group bundle {b}"
                         + (f"  env: {env}" if env else ""))
            cmd = self.serving.command(rep, host=rep.host or "NODE_IP", port=str(rep.port) if rep.port else "FREE_PORT")
            lines.append(shown_command(cmd))
        return lines

    def request_stop(self) -> None:
        """Make any wait for start-up give up and forbid new spawns (signal-safe); `stop` follows."""
        self.serving.stopping = True

    def drain_events(self) -> list[str]:
        """Status lines since the last call: deaths, failed restarts, returns."""
        return self.serving.drain()

    def describe(self) -> dict[str, Any]:
        """The launcher's JSON with every death's recovery timeline."""
        return super().describe() | {"recoveries": [dict(r) for r in self.recoveries]}

    # ---- start / stop -------------------------------------------------------------------------------------
    def _ray(self) -> Any:
        try:
            import ray
        except ImportError:
            raise LaunchError("the ray launcher needs Ray: pip install -e '.[ray]' (from a clone)") from None
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
        self._ray()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            for rep in self.replicas:
                rep.log.unlink(missing_ok=True)
                self._place(rep)
            self.serving.boot(self.replicas)
        except BaseException:
            self.stop()
            raise
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

    def stop(self) -> None:
        """Stop the watchdog, every server (SIGTERM → SIGKILL), actor and placement group; idempotent."""
        with self.serving.lock:
            self.serving.stopping = True
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
        if self.serving.tmp is not None:
            shutil.rmtree(self.serving.tmp, ignore_errors=True)
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
        with self.serving.lock:
            self._busy |= set(indices)
        try:
            ray.get([rep.actor.stop.remote(self.config.grace_s) for rep in moved],
                    timeout=self.config.grace_s + 30)
            for rep in moved:
                rep.port = ray.get(rep.actor.free_port.remote(rep.host, rep.port), timeout=60)
            self.serving.boot(moved)
        finally:
            with self.serving.lock:
                self._busy -= set(indices)

    def _watchdog(self) -> None:
        """Restart exited servers (and dead actors, on their placement group) until `stop`, with the shared
        `RestartPolicy` (the first try at once, try k after `restart_backoff_s` · 2^(k−2) s, at most 30 s)."""
        c, policy = self.config, RestartPolicy.of(self.config)
        tries: dict[int, int] = {}
        next_try: dict[int, float] = {}
        died: dict[int, tuple[float, str]] = {}
        while not self.serving.stopping:
            self._wake.wait(0.25)
            for rep in self.replicas:
                if self.serving.stopping:
                    return
                with self.serving.lock:
                    if rep.index in self._busy or rep.index in self._failed:
                        continue
                code = self.serving.site.poll(rep)
                if code is None:
                    continue
                now = time.monotonic()
                if rep.index not in died:
                    how = self.serving.site.how(code)
                    died[rep.index] = (now, how)
                    who = f"replica {rep.index} ({rep.pool.value} pool, {rep.url}, pid {rep.pid})"
                    self.serving.event(policy.death(who, how, self.serving.site.error(rep, last_line=False), rep.log))
                n = tries.get(rep.index, 0)
                if n >= c.restart_retries:
                    self._failed[rep.index] = f"replica {rep.index} ({rep.url}): {policy.gave_up(n)}"
                    self.serving.event(policy.stays_down(f"replica {rep.index} ({rep.url})", n))
                    continue
                if now < next_try.get(rep.index, 0.0):
                    continue
                tries[rep.index] = n = n + 1
                with self.serving.lock:
                    self._busy.add(rep.index)
                try:
                    if code == ACTOR_GONE:
                        self._place(rep)
                    else:
                        rep.port = ray_get(rep.actor.free_port.remote(rep.host, rep.port), 60)
                    rep.restarts += 1
                    self.serving.boot([rep])
                except Exception as exc:
                    next_try[rep.index] = time.monotonic() + policy.delay_s(n + 1)
                    self.serving.event(policy.failed_try(rep.index, n, exc))
                else:
                    t_dead, how = died.pop(rep.index)
                    back = time.monotonic() - t_dead
                    self.recoveries.append({"replica": rep.index, "how": how, "attempts": n,
                                            "back_s": round(back, 3), "boot_s": round(rep.boot_s, 3)})
                    self.serving.event(policy.back(f"replica {rep.index} ({rep.url})", back, n, rep.boot_s))
                    tries.pop(rep.index, None)
                finally:
                    with self.serving.lock:
                        self._busy.discard(rep.index)


def ray_get(ref: Any, timeout_s: float) -> Any:
    """`ray.get` with a timeout (ray imported lazily)."""
    import ray

    return ray.get(ref, timeout=timeout_s)
