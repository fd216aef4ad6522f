"""The router's knobs by name (issue 51): `RouterKnobs`' fields listed with their value kind, default and help line
(`router_knobs`), what the CLI's flags (`cli.flags.FLAGS`: `--rho`, `--dispatch`, `--max-redraws`, `--ranking`) and
slime's `tailsieve_*` settings are derived from, and the knobs' values of anything that holds them
(`router_values`: a parsed command line, a settings object) to build a `RouterConfig` with. A new knob is a field of
`RouterKnobs` and nothing else."""

from __future__ import annotations

import typing
from dataclasses import fields
from typing import Any

from tailsieve.policy.controller_knobs import Knob
from tailsieve.policy.router import Dispatch, RouterKnobs

__all__ = ["router_defaults", "router_knobs", "router_values"]


def router_knobs() -> tuple[Knob, ...]:
    """Every field of `RouterKnobs`, in declaration order: its kind as a flag or a setting parses it (a `Dispatch`
    as its text, checked by `RouterConfig`), its default (a `Dispatch` as its text) and its help line."""
    hints = typing.get_type_hints(RouterKnobs)
    out = []
    for f in fields(RouterKnobs):
        kind = str if hints[f.name] is Dispatch else hints[f.name]
        if kind not in (int, float, str):
            raise TypeError(f"RouterKnobs.{f.name}: no flag for a field of type {hints[f.name]}")
        default = f.default.value if isinstance(f.default, Dispatch) else f.default
        out.append(Knob(f.name, kind, False, default, str(f.metadata["help"])))
    return tuple(out)


def router_defaults() -> dict[str, Any]:
    """Knob name → its default (a `Dispatch` as its text)."""
    return {k.name: k.default for k in router_knobs()}


def router_values(holder: object) -> dict[str, Any]:
    """Knob name → its value on `holder` (a parsed command line, a `RouterKnobs`): the keyword arguments of the
    `RouterConfig` it sets."""
    return {k.name: getattr(holder, k.name) for k in router_knobs()}
