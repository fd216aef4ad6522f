"""The CPU GRPO example end to end (examples/grpo_cpu/train.py) for 3 steps on two REAL vLLM CPU replicas: every
consumed sample of step t was generated under weight version t (`stale_samples` = 0), the JSON has the documented
keys, and the replicas really changed weights (the engine's logprobs match the trainer's own after each update)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_fixtures import requires_vllm

pytestmark = [pytest.mark.real_server, pytest.mark.slow, requires_vllm, pytest.mark.timeout(900)]

TRAIN = Path(__file__).resolve().parents[1] / "examples" / "grpo_cpu" / "train.py"
KEYS = {"step", "reward_mean", "mean_length", "q", "m", "step_s", "stale_samples"}


def test_three_steps_on_policy(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(TRAIN.parents[2] / "src"))
    proc = subprocess.run([sys.executable, str(TRAIN), "--steps", "3", "--json", "--workdir", str(tmp_path),
                           "--plot", str(tmp_path / "grpo.png")], capture_output=True, text=True, env=env,
                          timeout=840)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    rows = out["steps"]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert [r["first_step"] for r in rows] == [True, False, False]  # step 0 is reported apart
    assert out["first_step_s"] == rows[0]["step_s"]
    assert out["mean_step_s_after_first"] == pytest.approx((rows[1]["step_s"] + rows[2]["step_s"]) / 2, abs=1e-3)
    for r in rows:
        assert set(r) >= KEYS
        assert r["stale_samples"] == 0 and r["weight_version"] == r["step"]
        # the default length profile: video-rl's lengths × 0.125, capped at 2048 × 0.125 = 256 tokens
        assert 0.0 <= r["reward_mean"] <= 1.0 and 1 <= r["mean_length"] <= r["max_length"] <= 256
        # the engine sampled from the weights the trainer just saved: bf16 rounding only (0.0008-0.004 nats per
        # token measured over 20 steps), while weights one step old differ by 0.11-0.22 nats (a stale server)
        assert r["logprob_gap"] < 0.02
    assert (tmp_path / "ckpt-0003" / "config.json").is_file() and (tmp_path / "grpo.png").stat().st_size > 0
    assert "step 2:" in proc.stderr and "verl-lif step" in proc.stderr
    assert (out["lengths"], out["length_scale"]) == ("video-rl", 0.125)
    assert "lengths: a length profile, video-rl's response lengths × 0.125 replayed" in proc.stderr
    # 3 steps leave one paired step after the window's first two: too few to tell a speedup from noise, unless the
    # controller never placed a tail pool in its two steady steps, when it dealt requests as the balancer does
    vs = out["vs_balancer"]
    assert (vs["balancer"], vs["paired_steps"], vs["tail_steps"]) == ("verl-lif", 1, sum(r["m"] > 0 for r in rows))
    if vs["tail_steps"]:
        assert vs["standing"] == "unknown"
        assert "against verl-lif: too few paired steps (1) to tell tailsieve from verl's balancer." in proc.stderr
    else:
        assert vs["standing"] == "same"
        assert "against verl-lif: tailsieve is the same as verl's balancer here: it never placed a tail pool" in (
            proc.stderr)


def test_bad_arguments_exit_with_one_line() -> None:
    proc = subprocess.run([sys.executable, str(TRAIN), "--steps", "0"], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(TRAIN.parents[2] / "src")), timeout=120)
    assert proc.returncode == 2 and proc.stderr == "train.py: error: --steps must be >= 1, got 0\n"
