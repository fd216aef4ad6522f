"""The router's knobs declared once (`RouterKnobs`, issue 51 item 3): the CLI's flags, slime's settings, verl's
`trainer.v1.tailsieve.*` keys and `RolloutConfig` (TRL's session) take them from its fields (`policy.router_knobs`),
with the flag names and config keys they always had."""

from __future__ import annotations

import argparse
from dataclasses import fields
from types import SimpleNamespace

import pytest

from tailsieve.cli import build_parser
from tailsieve.engines.rollout.rollout_config import RolloutConfig
from tailsieve.integrations.slime import SlimeSettings
from tailsieve.integrations.verl.session import TailSieveSettings
from tailsieve.policy.ranking import DEFAULT_RANKING
from tailsieve.policy.router import DEFAULT_REDRAWS, Dispatch, RouterConfig, RouterKnobs
from tailsieve.policy.router_knobs import router_defaults, router_knobs, router_values


def test_the_knobs_are_the_fields_with_their_help() -> None:
    assert [(k.name, k.kind, k.default) for k in router_knobs()] == [
        ("rho", float, 0.1), ("dispatch", str, "request"), ("max_redraws", int, DEFAULT_REDRAWS),
        ("ranking", str, DEFAULT_RANKING)]
    assert [k.help for k in router_knobs()] == [f.metadata["help"] for f in fields(RouterKnobs)]
    assert router_defaults() == {"rho": 0.1, "dispatch": "request", "max_redraws": 1, "ranking": DEFAULT_RANKING}
    assert router_values(RouterConfig(groups=4, rho=0.5, max_redraws=3)) == {
        "rho": 0.5, "dispatch": Dispatch.REQUEST, "max_redraws": 3, "ranking": DEFAULT_RANKING}


@pytest.mark.parametrize("holder", [RouterConfig, RolloutConfig, TailSieveSettings, SlimeSettings])
def test_every_configuration_extends_the_one_declaration(holder: type) -> None:
    """No configuration redeclares a knob: each is `RouterKnobs`' own field, its default included."""
    assert issubclass(holder, RouterKnobs)
    own = {f.name: f for f in fields(holder)}
    assert all(own[f.name].default == f.default for f in fields(RouterKnobs))
    assert all(getattr(own[f.name], "kw_only", False) for f in fields(RouterKnobs))


def _sub(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]  # type: ignore[no-any-return]


@pytest.mark.parametrize("cmd", ["simulate", "rollout"])
def test_the_flags_are_derived_from_the_fields(cmd: str) -> None:
    parser = _sub(cmd)
    for k in router_knobs():
        flag = "--" + k.name.replace("_", "-")
        a = next(a for a in parser._actions if flag in a.option_strings)
        assert (a.dest, a.default, a.help) == (k.name, k.default, k.help)
        assert a.type is (k.kind if k.kind in (int, float) else None)


def test_plan_defaults_the_knobs_it_has_no_flag_for() -> None:
    args = _sub("plan").parse_args([])
    assert router_values(args) == router_defaults()


def test_the_adapters_read_the_knobs_by_their_old_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    verl = TailSieveSettings.from_mapping({"max_redraws": 2, "dispatch": "group", "rho": 0.25})
    rc = verl.spec(8, 2, 4).router
    assert (rc.max_redraws, rc.dispatch, rc.rho, rc.ranking) == (2, Dispatch.GROUP, 0.25, DEFAULT_RANKING)
    for key in ("TAILSIEVE_MAX_REDRAWS", "TAILSIEVE_DISPATCH", "TAILSIEVE_RHO", "TAILSIEVE_RANKING"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("TAILSIEVE_MAX_REDRAWS", "3")
    slime = SlimeSettings.from_args(SimpleNamespace(rollout_batch_size=8, n_samples_per_prompt=2,
                                                    tailsieve_dispatch="group"))
    rc = slime.spec(3).router
    assert (rc.max_redraws, rc.dispatch, rc.rho) == (3, Dispatch.GROUP, 0.1)
    cfg = RolloutConfig(groups=4, group_size=2, max_redraws=2, ranking="stream-order")
    assert router_values(cfg.router(3)) == router_values(cfg) | {"dispatch": Dispatch.REQUEST}
