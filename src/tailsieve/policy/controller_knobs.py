"""The controller's constants by name (issue 40): one way for every driver to set any `ControllerConfig` field.

`knobs()` lists the fields with their value kind, default and help line (what `cli.flags.add_controller_flags`
derives its flags from), a nested config's (`ControllerConfig.paper`: `PaperConfig`) by their own flat names;
`controller_from_mapping` builds a `ControllerConfig` from a mapping of field name → value
(a framework's config table: verl's `trainer.v1.tailsieve.controller`, slime's `TAILSIEVE_CONTROLLER`, TRL's
`TrlSession(controller=)`), each value checked once: an unknown field, a value of the wrong kind or out of range is
one ConfigError line naming it as the caller spells it.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, fields, is_dataclass, replace
from typing import Any

from tailsieve.errors import ConfigError
from tailsieve.inputs import clip, excerpt
from tailsieve.policy.control_state import ControllerConfig

__all__ = ["Knob", "controller_from_mapping", "knobs", "renamed", "with_knobs"]


@dataclass(frozen=True, slots=True)
class Knob:
    """One `ControllerConfig` field: its name, value kind (int or float), whether None is allowed, default, help, and
    the field of `ControllerConfig` holding it when it is a nested config's (`paper`; "" for its own)."""

    name: str
    kind: type
    optional: bool
    default: Any
    help: str
    section: str = ""


def knobs() -> tuple[Knob, ...]:
    """Every field of `ControllerConfig`, a nested config's in its place, in declaration order (TypeError for a field
    of another kind: a new field of a kind no flag or mapping can carry fails here, not silently)."""
    return _knobs(ControllerConfig, "")


def _knobs(config: type, section: str) -> tuple[Knob, ...]:
    hints = typing.get_type_hints(config)
    out: list[Knob] = []
    for f in fields(config):
        if isinstance(hints[f.name], type) and is_dataclass(hints[f.name]) and not section:
            out += _knobs(hints[f.name], f.name)
            continue
        args = set(typing.get_args(hints[f.name])) or {hints[f.name]}
        optional = type(None) in args
        kinds = args - {type(None)}
        if len(kinds) != 1 or not kinds <= {int, float}:
            raise TypeError(f"{config.__name__}.{f.name}: no flag for a field of type {hints[f.name]}")
        default = f.default if f.default is not MISSING else None
        out.append(Knob(f.name, kinds.pop(), optional, default, str(f.metadata.get("help", "")), section))
    return tuple(out)


def with_knobs(base: ControllerConfig, values: Mapping[str, Any]) -> ControllerConfig:
    """`base` with the knobs `values` names (flat names, a nested config's included) replaced; ConfigError from the
    config's own checks."""
    section = {k.name: k.section for k in knobs()}
    own = {k: v for k, v in values.items() if not section[k]}
    nested: dict[str, dict[str, Any]] = {}
    for k, v in values.items():
        if section[k]:
            nested.setdefault(section[k], {})[k] = v
    parts = {s: replace(getattr(base, s), **kw) for s, kw in nested.items()}
    return replace(base, **own, **parts)


def renamed(message: str, spell: Callable[[str], str]) -> str:
    """A `ControllerConfig` error with its field named as the caller spells it (`z must be …` → `--z must be …`)."""
    for k in sorted((k.name for k in knobs()), key=len, reverse=True):
        if message.startswith(k + " "):
            return spell(k) + message[len(k):]
    return message


def _value(knob: Knob, v: Any, name: str) -> Any:
    """`v` checked against the field's kind (an int is a float; a bool is neither)."""
    if v is None and knob.optional:
        return None
    if knob.kind is int and (isinstance(v, bool) or not isinstance(v, int)):
        raise ConfigError(f"{name} must be an integer{' or null' if knob.optional else ''}, got {excerpt(v)}")
    if knob.kind is float:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ConfigError(f"{name} must be a number, got {excerpt(v)}")
        if not math.isfinite(v):
            raise ConfigError(f"{name} must be finite, got {excerpt(v)}")
        return float(v)
    return v


def controller_from_mapping(mapping: Mapping[str, Any] | None, where: str, base: ControllerConfig | None = None, *,
                            spell: Callable[[str], str] | None = None) -> ControllerConfig:
    """`base` (default: the defaults) with the fields `mapping` names replaced; `where` names the mapping in errors
    and `spell(field)` how a field is written there (default `{where}.{field}`). A ConfigError line for a mapping
    that is not one, an unknown field, or a value of the wrong kind or range."""
    name = spell or (lambda k: f"{where}.{k}")
    if mapping is None:
        return base or ControllerConfig()
    if not isinstance(mapping, Mapping):
        raise ConfigError(f"{where} must be a mapping of controller fields, got {type(mapping).__name__}")
    by_name = {k.name: k for k in knobs()}
    unknown = sorted(str(k) for k in mapping if k not in by_name)
    if unknown:
        raise ConfigError(f"{where}: unknown controller field(s) {clip(', '.join(unknown))} "
                          f"(valid: {', '.join(by_name)})")
    values = {k: _value(by_name[k], v, name(k)) for k, v in mapping.items()}
    try:
        return with_knobs(base or ControllerConfig(), values)
    except ConfigError as exc:
        raise ConfigError(renamed(str(exc), name)) from None
