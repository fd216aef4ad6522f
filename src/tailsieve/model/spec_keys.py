"""Speculation settings' keys (§3.4): the keys a config-file table or a `--spec` flag may name (`SPEC_KEYS`),
`spec_from_mapping` (a `SpecConfig` from such a table) and `SpecContext` (what a bare `mtp` / `dflash` resolves
against). One floor below both readers that use them: `model/spec_parse.py` (flags and config files) and
`model/spec_fit.py` (a fitted model file's constants), so neither imports the other back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tailsieve.errors import ConfigError
from tailsieve.inputs import excerpt
from tailsieve.model.spec_records import Family
from tailsieve.model.speculative import MAX_TOKENS, SpecConfig, SpecMethod, method_names

__all__ = ["SPEC_KEYS", "SpecContext", "spec_from_mapping"]

SPEC_KEYS = ("method", "tokens", "acceptance", "decay", "draft_cost", "verify_cost", "draft_share", "token_cost",
             "token_cost_slope", "acceptance_slope", "draft_cpu_s")


def spec_from_mapping(obj: Any, where: str) -> SpecConfig:
    """A `SpecConfig` from loosely typed keys (a config-file table), with one-line errors naming `where.key`."""
    if not isinstance(obj, dict):
        raise ConfigError(f"{where} must be a table with keys {', '.join(SPEC_KEYS)}, got {excerpt(obj)}")
    unknown = sorted(set(obj) - set(SPEC_KEYS))
    if unknown:
        raise ConfigError(f"unknown key {where}.{unknown[0]} (valid: {', '.join(SPEC_KEYS)})")
    raw = obj.get("method", "none")
    try:
        method = SpecMethod(str(raw).strip().lower())
    except ValueError:
        raise ConfigError(f"{where}.method must be one of {method_names()}, got {excerpt(raw)}") from None
    kw: dict[str, Any] = {}
    for key in SPEC_KEYS[1:]:
        if key not in obj:
            continue
        v = obj[key]
        if key == "tokens" and (isinstance(v, bool) or not isinstance(v, int)):
            raise ConfigError(f"{where}.tokens must be an integer in 0..{MAX_TOKENS}, got {excerpt(v)}")
        if key != "tokens" and (isinstance(v, bool) or not isinstance(v, int | float)):
            raise ConfigError(f"{where}.{key} must be a number, got {excerpt(v)}")
        kw[key] = v
    try:
        return SpecConfig(method, **kw)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


@dataclass(frozen=True, slots=True)
class SpecContext:
    """What a bare `mtp` / `dflash` resolves against: the `--curve`'s model family, and the speculative server a
    `tailsieve profile --method` fit measured (the `--curve` model file's `speculative.concurrency_fit`), which then
    takes the central profile's place: a user's own numbers first."""

    family: Family = Family.DENSE
    fitted: SpecConfig | None = None
