"""Local launcher faults with fake server processes (tests/fake_vllm_proc.py): a replica whose server dies while
serving has its whole process group reaped (no orphans), is restarted in place with bounded retries while the other
replica keeps serving, and the status lines name it with its exit code or signal; `tailsieve launch` keeps running;
`Replicas.reprobe_down` takes a replica that came back into the very next step."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from engine_fake import FakeServer
from launch_harness import FAKE
from tailsieve.engines.launch import LocalLauncher
from tailsieve.engines.launch.config import LaunchConfig, PoolEngine
from tailsieve.engines.launch.process import exit_how, http_healthy
from tailsieve.engines.rollout.api import Rollout, RolloutConfig
from tailsieve.engines.rollout.prompts import PromptRecord
from tailsieve.engines.transport.engine_client import SamplingParams
from tailsieve.engines.transport.health import FaultPolicy

pytestmark = pytest.mark.timeout(120)


def fake_cfg(model: Path, **kw: object) -> LaunchConfig:
    base = LaunchConfig(model=str(model), replicas=2, command=FAKE, startup_timeout_s=30, grace_s=3, memory=1,
                        restart_backoff_s=0.1, bulk=PoolEngine(args=("--fake-child",)))
    return replace(base, **kw)  # type: ignore[arg-type]


def group_pids(pgid: int) -> list[int]:
    """Every live (non-zombie) process whose process group is `pgid` (from /proc)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # state, ppid, pgrp, ...
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(d))
    return out


def until(cond: Callable[[], bool], timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


def test_exit_how_names_code_or_signal() -> None:
    assert exit_how(None) == "running" and exit_how(3) == "exited with code 3"
    assert exit_how(-9) == "killed by signal SIGKILL" and exit_how(-15) == "killed by signal SIGTERM"


def test_dead_server_is_reaped_and_restarted_while_the_other_serves(model: Path, tmp_path: Path) -> None:
    la = LocalLauncher(fake_cfg(model), tmp_path / "logs")
    try:
        la.start()
        r0, r1 = la.replicas
        assert r0.proc and r1.proc
        pid0, pid1 = r0.proc.pid, r1.proc.pid
        assert until(lambda: len(group_pids(pid0)) == 2)  # the server and its engine-core-like child
        child = next(p for p in group_pids(pid0) if p != pid0)
        t0 = time.monotonic()
        os.kill(pid0, signal.SIGKILL)  # the API server only, as `kill -9 PID` would: its child is left running
        assert until(lambda: r0.proc is not None and r0.proc.pid != pid0 and r0.state == "up", 30)
        back_s = time.monotonic() - t0
        assert group_pids(pid0) == [] and child not in group_pids(pid0)  # no orphan engine core left behind
        assert http_healthy(r0.url) and http_healthy(r1.url)
        assert r1.proc.pid == pid1 and r1.restarts == 0 and r0.restarts == 1  # the other replica never stopped
        events = la.drain_events()
        assert any(f"replica 0 (bulk pool, port {r0.port}, pid {pid0}) killed by signal SIGKILL" in e
                   and "process group reaped" in e for e in events), events
        assert any(e.startswith("replica 0 ") and "back in service" in e for e in events), events
        assert la.failure() is None and la.drain_events() == []
        rec = la.describe()["recoveries"]
        assert rec[0]["how"] == "killed by signal SIGKILL" and rec[0]["reaped"] and rec[0]["back_s"] <= back_s + 1
    finally:
        la.stop()
    assert all(group_pids(r.proc.pid) == [] for r in la.replicas if r.proc)


def test_restarts_are_bounded_and_the_others_keep_serving(model: Path, tmp_path: Path) -> None:
    marker = tmp_path / "crash-on-restart"
    cfg = fake_cfg(model, restart_retries=2, bulk=PoolEngine(args=("--fake-crash-if", str(marker))))
    la = LocalLauncher(cfg, tmp_path / "logs")
    try:
        la.start()
        marker.touch()
        la.kill(0)
        assert until(lambda: la.replicas[0].state == "failed", 30)
        events = la.drain_events()
        assert sum("replica 0 restart" in e and "failed" in e and "ValueError" in e for e in events) == 2, events
        assert "stays down: 2 restart(s) failed" in events[-1]
        assert la.replicas[1].alive() and http_healthy(la.replicas[1].url) and la.failure() is None
        la.kill(1)
        assert until(lambda: la.failure() is not None, 30)
        assert "every replica died" in (la.failure() or "")
    finally:
        la.stop()
    assert all(group_pids(r.proc.pid) == [] for r in la.replicas if r.proc)


def test_cli_launch_keeps_serving_when_a_replica_dies(model: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "launch.toml"
    cfg.write_text(f'[launch]\nmodel = "{model}"\ncommand = {json.dumps(list(FAKE))}\nstartup_timeout_s = 30.0\n'
                   "grace_s = 3.0\nrestart_backoff_s = 0.1\n")
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "tailsieve", "launch", "--config", str(cfg), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline().decode().count("http://") == 2
        doc = json.loads((out / "launch.json").read_text())
        os.kill(doc["replicas"][1]["pid"], signal.SIGKILL)
        assert until(lambda: bool(json.loads((out / "launch.json").read_text())["recoveries"]), 30)
        assert until(lambda: "back_s" in json.loads((out / "launch.json").read_text())["recoveries"][0], 30)
        assert proc.poll() is None  # still serving
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        err = proc.stderr.read().decode() if proc.stderr else ""
        assert "replica 1 (bulk pool" in err and "killed by signal SIGKILL" in err and "back in service" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    doc = json.loads((out / "launch.json").read_text())
    assert doc["stopped"] and all(group_pids(r["pid"]) == [] for r in doc["replicas"])


def test_down_replica_is_reprobed_right_before_dispatch() -> None:
    slow_probe = FaultPolicy(stall_timeout_s=0.4, backoff_s=0.01, probe_interval_s=30.0, probe_max_s=30.0,
                             no_healthy_wait_s=0.3)
    rc = RolloutConfig(groups=6, group_size=4, rho=0.5, policy="static", q=1, m=1,
                       sampling=SamplingParams(max_tokens=40), faults=slow_probe)
    prompts = tuple(PromptRecord(f"p{i}", f"prompt number {i}") for i in range(40))
    with FakeServer() as a, FakeServer() as b, FakeServer() as c:
        c.mode = "500"

        async def go() -> tuple[tuple[int, ...], tuple[int, ...], set[int]]:
            async with Rollout([a.url, b.url, c.url], rc, prompts) as r:
                first = await r.step()
                c.mode = "ok"  # back up; its background probe would not look again for 30 s
                second = await r.step()
                return first.down, second.down, {s.replica for g in second.groups for s in g.samples}

        down0, down1, used = asyncio.run(go())
    assert down0 == (2,) and down1 == () and 2 in used
