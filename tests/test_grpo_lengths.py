"""The GRPO example's length profile and balancer flags (examples/grpo_cpu/train.py, issue 42): by default it replays
video-rl's lengths × 0.125 and measures verl's balancer beside every step, says so in one line, and refuses a bad
profile in one line before anything starts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

TRAIN = Path(__file__).resolve().parents[1] / "examples" / "grpo_cpu" / "train.py"


@pytest.fixture(scope="module")
def train() -> ModuleType:
    spec = importlib.util.spec_from_file_location("grpo_train_lengths", TRAIN)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_default_is_a_length_profile_against_the_balancer(train: ModuleType) -> None:
    a = train.parse([])
    assert (a.lengths, a.length_scale, a.against) == ("video-rl", 0.125, "verl-lif")
    w = train.length_profile(a)
    assert w is not None and w.name == "video-rl" and w.max_length == 2048
    assert train.profile_line(a, w) == (
        "lengths: a length profile, video-rl's response lengths × 0.125 replayed (ignore_eos, max_tokens per "
        "request, cap 256 tokens); --lengths none for the policy's own")
    own = train.parse(["--lengths", "none", "--max-tokens", "64", "--against", "none"])
    assert train.length_profile(own) is None and own.against == "none"
    assert train.profile_line(own, None) == "lengths: the policy's own, capped at 64 tokens (--lengths none)"


@pytest.mark.parametrize(("argv", "message"), [
    (["--length-scale", "0"], "--length-scale must lie in (0, 1], got 0.0"),
    (["--length-scale", "2"], "--length-scale must lie in (0, 1], got 2.0"),
    (["--lengths", "nope"], "--lengths nope: no such trace 'nope': not a bundled workload"),
    (["--against", "uniform"], "argument --against: invalid choice: 'uniform'"),
])
def test_a_bad_profile_is_one_line(train: ModuleType, argv: list[str], message: str,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        train.parse(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.startswith(f"train.py: error: {message}") and err.count("\n") == 1
