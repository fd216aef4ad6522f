"""`tailsieve launch` and `rollout --launch` with fake server processes (tests/fake_vllm_proc.py): the CLI's files,
stdout, errors and signals, pool moves priced at the measured boot time, and the endpoints read after the launcher
started. The launcher itself (commands, placement, start-up failures, SIGTERM → SIGKILL): tests/test_launch.py; what
both share: tests/launch_harness.py."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from launch_harness import NGRAM, fake_cfg, gone, write_cfg
from tailsieve.cli import main
from tailsieve.engines.launch import LocalLauncher as Launcher
from tailsieve.engines.launch.config import LaunchConfig

pytestmark = pytest.mark.timeout(120)



def test_cli_writes_endpoints_and_stops(model: Path, tmp_path: Path, record: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert main(["launch", "--config", str(write_cfg(tmp_path, model)), "--m", "1", "--duration", "0.3",
                 "--out", str(out)]) == 0
    line = capsys.readouterr().out.strip()
    assert line == (out / "endpoints.txt").read_text().strip() and line.count("http://127.0.0.1:") == 2
    doc = json.loads((out / "launch.json").read_text())
    assert doc["stopped"] and doc["replicas"][1]["pool"] == "tail" and doc["replicas"][1]["flags"]
    assert all(gone(r["pid"]) for r in doc["replicas"])


def test_cli_errors_are_one_line(model: Path, tmp_path: Path, record: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_cfg(tmp_path, model)
    assert main(["launch", "--config", str(cfg), "--model", str(tmp_path / "nope"), "--out", str(tmp_path)]) == 1
    assert capsys.readouterr().err.strip().endswith(f"model path {tmp_path / 'nope'} does not exist")
    assert main(["launch", "--config", str(cfg), "--tail-args=--fake-crash", "--m", "1", "--out",
                 str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("tailsieve launch: error: replica 1 (tail pool, speculative ngram") and "ValueError" in err
    assert main(["launch", "--model", str(model), "--tail-speculative", "[1]", "--tail-spec", "ngram"]) == 1
    assert "expected a JSON object" in capsys.readouterr().err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_cli_signal_stops_every_replica(model: Path, tmp_path: Path, record: Path, sig: signal.Signals) -> None:
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "tailsieve", "launch", "--config", str(write_cfg(tmp_path, model)),
                             "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = proc.stdout.readline().decode().strip() if proc.stdout else ""
        assert line.count("http://") == 2
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    doc = json.loads((out / "launch.json").read_text())
    assert doc["stopped"] and all(gone(r["pid"]) for r in doc["replicas"])


def test_rollout_launch_moves_replicas_and_counts_restarts(model: Path, tmp_path: Path, record: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"what is {i}?"}) + "\n" for i in range(30)))
    out = tmp_path / "run"
    rc = main(["rollout", "--launch", str(write_cfg(tmp_path, model)), "--prompts", str(prompts), "--groups", "4",
               "--group-size", "2", "--rho", "0.5", "--max-tokens", "20", "--steps", "3", "--policy", "static",
               "--q", "1", "--m", "1", "--out", str(out)])
    assert rc == 0
    steps = [json.loads(x) for x in (out / "static" / "steps.jsonl").read_text().splitlines()]
    assert [s["m"] for s in steps] == [0, 1, 1]  # warm-up runs every replica as bulk
    assert steps[0]["restart_s"] == 0 and steps[1]["restart_s"] > 0 and steps[2]["restart_s"] == 0
    assert steps[1]["makespan_s"] >= steps[1]["restart_s"]
    rep = json.loads((out / "report.json").read_text())
    assert rep["policies"]["static"]["restart_s"] == pytest.approx(steps[1]["restart_s"])
    assert rep["launch"]["tail"]["speculative_config"]["method"] == "ngram" and rep["spec"]["tail"]["tokens"] == 3
    assert sum(r["restarts"] for r in rep["launch"]["replicas"]) == 1 and rep["launch"]["tail_replicas"] == 1
    pids = [json.loads(x)["pid"] for x in record.read_text().splitlines()]
    assert len(pids) == 3 and all(gone(p) for p in pids)  # 2 starts + 1 restart, all stopped
    assert main(["rollout", "--launch", "x.toml", "--endpoints", "http://a:1", "--prompts", str(prompts),
                 "--out", str(tmp_path / "o")]) == 1


def test_rollout_prices_a_pool_move_at_the_measured_boot_time(model: Path, tmp_path: Path) -> None:
    from tailsieve.cli.rollout_cmd import with_move_price
    from tailsieve.engines.rollout.api import RolloutConfig

    configs = {"tailsieve": RolloutConfig(groups=4, policy="tailsieve")}
    la = Launcher(fake_cfg(model, tail=NGRAM), tmp_path / "logs")
    la.replicas[0].boot_s, la.replicas[1].boot_s = 12.0, 31.5
    priced = with_move_price(configs, la)
    assert priced["tailsieve"].controller.move_cost_s == 31.5  # the slowest start-up: the flags differ
    same = Launcher(fake_cfg(model), tmp_path / "logs2")  # identical pools: moves never restart
    same.replicas[0].boot_s = 40.0
    assert with_move_price(configs, same)["tailsieve"].controller.move_cost_s == 0.0


def test_rollout_launch_reads_endpoints_after_the_launcher_started(model: Path, tmp_path: Path, record: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 23: the Ray launcher learns each replica's node and port only in `start()` (before it, its endpoints
    are `http://127.0.0.1:0`); `rollout --launch` must read them after. The real local launcher, with its ports
    chosen in `start()` exactly like the Ray launcher's, shows the order."""
    from tailsieve.cli import rollout_cmd
    from tailsieve.engines.launch import base, local_launcher
    from tailsieve.engines.launch.process import pick_port

    class LatePorts(local_launcher.LocalLauncher):
        def __init__(self, config: LaunchConfig, log_dir: Path) -> None:
            super().__init__(config, log_dir)
            for rep in self.replicas:
                rep.port = 0

        def start(self) -> LatePorts:
            taken: set[int] = set()
            for rep in self.replicas:
                rep.port = pick_port(self.config.host, taken)
                taken.add(rep.port)
            return super().start()

    monkeypatch.setitem(base.LAUNCHERS, "late-ports", LatePorts)
    monkeypatch.setattr(rollout_cmd, "launcher_for", lambda config: "late-ports")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"what is {i}?"}) + "\n" for i in range(30)))
    out = tmp_path / "run"
    rc = main(["rollout", "--launch", str(write_cfg(tmp_path, model)), "--prompts", str(prompts), "--groups", "4",
               "--group-size", "2", "--max-tokens", "20", "--steps", "2", "--policy", "static", "--q", "1",
               "--m", "1", "--out", str(out)])
    assert rc == 0
    rep = json.loads((out / "report.json").read_text())
    ports = [json.loads(x)["port"] for x in record.read_text().splitlines()]
    assert len(rep["endpoints"]) == 2 and {int(u.rsplit(":", 1)[1]) for u in rep["endpoints"]} == set(ports)
    assert 0 not in ports and all(u.startswith("http://127.0.0.1:") for u in rep["endpoints"])
