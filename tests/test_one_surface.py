"""One surface, no shims (issue 42): nothing has been released, so the 0.1 module paths, `RouterConfig.max_cuts`,
`Rollout(assign=)`, `profile/rollout --model` and the hidden `--trace`/`--policies` are gone, and a peer policy's
rollout is built by `make_rollout`, not by `Rollout.__new__` handing back another class."""

from __future__ import annotations

import importlib

import pytest

from tailsieve.cli import main
from tailsieve.engines.rollout.api import Rollout, RolloutConfig
from tailsieve.engines.rollout.peer_rollout import PeerRollout, make_rollout
from tailsieve.engines.rollout.prompts import PromptRecord
from tailsieve.errors import ConfigError
from tailsieve.policy.peers import PEERS
from tailsieve.policy.router import RouterConfig

# Every path `tailsieve/_compat.py` aliased: the 0.1 flat layout and the 0.2 engine split (42; the issue said 43).
OLD_PATHS = [
    "tailsieve.curves", "tailsieve.makespan", "tailsieve.oracle", "tailsieve.baselines", "tailsieve.tailstrength",
    "tailsieve.speculative", "tailsieve.router", "tailsieve.controller", "tailsieve.predictor", "tailsieve.replica",
    "tailsieve.sim", "tailsieve.spec_budget", "tailsieve.traces", "tailsieve.synthetic", "tailsieve.metrics",
    "tailsieve.analysis_report", "tailsieve.engines.client", "tailsieve.engines.replies", "tailsieve.engines.backends",
    "tailsieve.engines.sglang_native", "tailsieve.engines.health", "tailsieve.engines.types",
    "tailsieve.engines.executor", "tailsieve.engines.batch", "tailsieve.engines.resume", "tailsieve.engines.state",
    "tailsieve.engines.prompts", "tailsieve.engines.runner", "tailsieve.engines.weights",
    "tailsieve.engines.launch_config", "tailsieve.engines.local", "tailsieve.engines.launchers",
    "tailsieve.engines.launchers.base", "tailsieve.engines.launchers.local", "tailsieve.engines.launchers.process",
    "tailsieve.engines.launchers.ray", "tailsieve.engines.launchers.ray_server", "tailsieve.engines.launchers.restart",
    "tailsieve.engines.launchers.vllm_server", "tailsieve.engines.launchers.amx", "tailsieve.engines.profile",
    "tailsieve.engines.spec_measure",
]
URLS = ["http://127.0.0.1:9", "http://127.0.0.1:10"]  # never contacted: building a rollout sends nothing
PROMPTS = [PromptRecord(f"p{i}", "hi") for i in range(8)]


@pytest.mark.parametrize("old", OLD_PATHS)
def test_an_old_module_path_no_longer_imports(old: str) -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)


def test_no_deprecated_keyword_is_accepted() -> None:
    with pytest.raises(TypeError, match="max_cuts"):
        RouterConfig(max_cuts=3)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="assign"):
        Rollout(URLS, RolloutConfig(groups=2, group_size=2), PROMPTS, assign=lambda m: 0.0)  # type: ignore[call-arg]


@pytest.mark.parametrize("argv", [
    ["route", "--trace", "x"], ["route", "--policies", "uniform"], ["oracle", "--trace", "x"],
    ["profile", "--endpoint", URLS[0], "--out", "o.json", "--model", "m"],
    ["rollout", "--endpoints", URLS[0], "--prompts", "p.jsonl", "--out", "o", "--model", "m"],
], ids=["route--trace", "route--policies", "oracle--trace", "profile--model", "rollout--model"])
def test_a_removed_flag_is_refused_in_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    flag = next(a for a in argv[1:] if a in ("--trace", "--policies", "--model"))
    value = argv[argv.index(flag) + 1]
    assert exc.value.code == 2
    assert err == f"tailsieve {argv[0]}: error: unrecognized arguments: {flag} {value}\n"


def test_rollout_builds_only_rollouts() -> None:
    assert "__new__" not in vars(Rollout)


@pytest.mark.parametrize("policy", list(PEERS))
def test_a_peer_policy_is_built_by_make_rollout_and_refused_by_rollout(policy: str) -> None:
    cfg = RolloutConfig(groups=2, group_size=2, policy=policy)
    r = make_rollout(URLS, cfg, PROMPTS)
    assert type(r) is PeerRollout and r.config.policy == policy
    with pytest.raises(ConfigError, match=rf"^{policy} is a peer policy: make_rollout\(endpoints, config, prompts\) "
                                          r"builds its PeerRollout$"):
        Rollout(URLS, cfg, PROMPTS)


@pytest.mark.parametrize("policy", ["tailsieve", "uniform", "tailsieve-fixed"])
def test_a_controller_policy_is_a_plain_rollout_either_way(policy: str) -> None:
    cfg = RolloutConfig(groups=2, group_size=2, policy=policy)
    assert type(make_rollout(URLS, cfg, PROMPTS)) is Rollout and type(Rollout(URLS, cfg, PROMPTS)) is Rollout
