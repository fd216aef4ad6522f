"""The replica-launcher seam (`ReplicaLauncher`, docs/launch.md): `assign` takes explicit tail replica ids and
restarts only the replicas whose flags change, `pool_hook(plan)` is `assign(plan.tail_replicas)` for a real router
plan, and the registry builds launchers by name. A process-free launcher shows what a new backend implements."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from launch_harness import NGRAM, fake_cfg, gone
from tailsieve.engines.launch import (
    LAUNCHERS,
    LaunchError,
    LocalLauncher,
    ReplicaLauncher,
    ReplicaSlot,
    initial_pools,
    make_launcher,
    register_launcher,
)
from tailsieve.engines.launch.config import LaunchConfig
from tailsieve.errors import ConfigError
from tailsieve.policy.router import Router, RouterConfig, RouterState
from tailsieve.policy.step import GroupRef, Pool

pytestmark = pytest.mark.timeout(120)


class MemLauncher(ReplicaLauncher):
    """A launcher without processes: what a new backend (e.g. Ray) implements, recording each relaunch."""

    def __init__(self, config: LaunchConfig, log_dir: Path) -> None:
        super().__init__(config, log_dir)
        self._slots = [ReplicaSlot(index=i, pool=p, engine=config.engine(p is Pool.TAIL))
                       for i, p in enumerate(initial_pools(config))]
        self.relaunched: list[list[int]] = []
        self.up = False

    def start(self) -> MemLauncher:
        self.up = True
        return self

    def stop(self) -> None:
        self.up = False

    @property
    def endpoints(self) -> list[str]:
        return [f"mem://{s.index}" for s in self._slots]

    def healthy(self, i: int) -> bool:
        return self.up

    @property
    def slots(self) -> list[ReplicaSlot]:
        return self._slots

    def _relaunch(self, indices: Sequence[int]) -> None:
        self.relaunched.append(list(indices))


def test_assign_takes_explicit_replica_ids(model: Path, tmp_path: Path) -> None:
    """The tail pool is whatever ids the plan names (here replica 0, not the last one): only replicas whose flags
    change restart, and an unchanged set restarts nothing."""
    la = MemLauncher(fake_cfg(model, replicas=3, places=(), tail=NGRAM, tail_replicas=1), tmp_path)
    assert la.pools == (Pool.BULK, Pool.BULK, Pool.TAIL) and la.tail_replicas == (2,)  # the router's split at start
    with la:
        assert la.assign([0]) >= 0.0 and la.relaunched == [[0, 2]]  # 0 joins the tail, 2 leaves it
        assert la.assign([0]) == 0.0 and la.relaunched == [[0, 2]]
        assert la.pools == (Pool.TAIL, Pool.BULK, Pool.BULK) and la.m == 1 and la.health() == [True] * 3
        la.assign([0, 1])
        assert la.relaunched[-1] == [1] and [s.restarts for s in la.slots] == [1, 1, 1]
        assert la.restart([2], [Pool.TAIL]) >= 0.0 and la.relaunched[-1] == [2] and la.tail_replicas == (0, 1, 2)
        doc = la.describe()
        assert doc["tail_ids"] == [0, 1, 2] and doc["replicas"][2]["flags"] == list(NGRAM.flags())
    assert not la.up
    with pytest.raises(LaunchError, match=r"tail replicas repeat an id: \[0, 0\]"):
        la.assign([0, 0])


def test_assign_restarts_exactly_the_named_replica(model: Path, tmp_path: Path, record: Path) -> None:
    cfg = fake_cfg(model, replicas=3, places=("0", "1", "1"), tail=NGRAM)
    with LocalLauncher(cfg, tmp_path / "logs") as la:
        pids = [r.proc.pid for r in la.replicas if r.proc]
        assert la.assign([0]) > 0 and [r.restarts for r in la.replicas] == [1, 0, 0]
        assert [r.proc.pid for r in la.replicas if r.proc][1:] == pids[1:] and gone(pids[0])
        last = json.loads(record.read_text().splitlines()[-1])
        assert "--speculative-config" in last["argv"] and last["port"] == la.replicas[0].port
        assert la.assign([0]) == 0.0 and [r.restarts for r in la.replicas] == [1, 0, 0]
        assert la.pools == (Pool.TAIL, Pool.BULK, Pool.BULK) and la.healthy(0) and la.failure() is None


def test_pool_hook_is_assign_of_the_plans_tail_replicas(running: LocalLauncher) -> None:
    la = running
    router = Router(RouterConfig(groups=2, group_size=2, replicas=2, rho=0.5), [f"p{i}" for i in range(8)])
    state: RouterState = replace(router.initial_state(), candidates=(GroupRef(7, "p7", 1),))
    plan = router.plan(state, 1, 1)
    assert plan.tail_replicas == (1,) and plan.bulk_replicas == (0,)
    t = la.pool_hook(plan)
    assert t > 0 and la.tail_replicas == plan.tail_replicas and la.restart_s_total == pytest.approx(t)
    assert la.assign(plan.tail_replicas) == 0.0 == la.pool_hook(plan)
    uniform = router.plan(state, 0, 0)
    assert la.pool_hook(uniform) > 0 and la.tail_replicas == () and [r.restarts for r in la.replicas] == [0, 2]


def test_registry_lists_local_and_refuses_unknown_names(model: Path, tmp_path: Path) -> None:
    assert LAUNCHERS["local"] is LocalLauncher and LocalLauncher.name == "local"
    assert isinstance(make_launcher("local", fake_cfg(model), tmp_path), LocalLauncher)
    with pytest.raises(ConfigError, match=r"^unknown launcher 'k8s' \(valid: local, ray\)$") as e:
        make_launcher("k8s", fake_cfg(model), tmp_path)
    assert "\n" not in str(e.value)
    try:
        assert register_launcher("test-mem")(MemLauncher) is MemLauncher
        built = make_launcher("test-mem", fake_cfg(model), tmp_path)
        assert isinstance(built, MemLauncher) and built.name == "test-mem"
        with pytest.raises(ValueError, match="already registered"):
            register_launcher("local")(MemLauncher)
    finally:
        LAUNCHERS.pop("test-mem", None)


def test_ray_launcher_is_registered_and_chosen_by_config(tmp_path: Path) -> None:
    from tailsieve.engines.launch import LAUNCHERS, RayLauncher, launcher_for
    from tailsieve.engines.launch.config import Device, launch_from_mapping
    from tailsieve.engines.launch.ray_launcher import bundle
    from tailsieve.model.speculative import SpecConfig

    assert LAUNCHERS["ray"] is RayLauncher
    assert launcher_for(LaunchConfig(model="m")) == "local"
    cfg = launch_from_mapping({"model": "m", "ray": "auto", "cores": ["0-1", "2"]}, SpecConfig(), SpecConfig())
    assert cfg.ray == "auto" and launcher_for(cfg) == "ray"
    assert bundle(cfg, 0) == {"CPU": 2.0} and bundle(cfg, 1) == {"CPU": 1.0}
    gpu = LaunchConfig(model="m", device=Device.GPU, args=("--tensor-parallel-size", "4"), ray="10.0.0.1:6379")
    assert bundle(gpu, 0) == {"CPU": 1.0, "GPU": 4.0}
    with pytest.raises(ConfigError, match="launch.ray"):
        LaunchConfig(model="m", ray="bad address!")
    lines = RayLauncher(cfg, tmp_path).dry_run()
    assert lines[0] == "# ray cluster: auto" and "placement group bundle" in lines[1]
    assert "--host NODE_IP --port FREE_PORT" in lines[2]


def test_launch_cli_ray_dry_run(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from tailsieve.cli import main

    assert main(["launch", "--ray", "auto", "--model", "org/tiny", "--replicas", "2", "--dry-run",
                 "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "# ray cluster: auto" and sum("--host NODE_IP --port FREE_PORT" in ln for ln in out) == 2


@pytest.mark.extra("ray")
def test_launch_cli_unreachable_ray_cluster_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """An address nothing listens on fails at once (Ray itself would retry for minutes), naming the address."""
    from tailsieve.cli import main
    from tailsieve.engines.launch.tiny_vllm import free_port

    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    port = free_port()
    t0 = time.monotonic()
    rc = main(["launch", "--ray", f"127.0.0.1:{port}", "--model", str(folder), "--replicas", "1",
               "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and time.monotonic() - t0 < 15
    assert err[-1].startswith(f"tailsieve launch: error: the Ray cluster at 127.0.0.1:{port} is not reachable")
