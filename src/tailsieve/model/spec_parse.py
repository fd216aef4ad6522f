"""Speculation settings from text and files (§3.4): `parse_spec` reads `METHOD[:TOKENS][,key=value…]` flags and
built-in or fitted profiles, `load_config_file` a simulate config's `spec.tail` / `spec.bulk` tables (their keys and
`spec_from_mapping`: `model/spec_keys.py`); every error is one line naming where (`model/speculative.py` holds the
model they build)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from tailsieve.errors import ConfigError
from tailsieve.inputs import ascii_float, ascii_int, excerpt, load_document
from tailsieve.model.spec_calibration import PROFILE_METHODS, profile, profile_names
from tailsieve.model.spec_fit import spec_from_profile_file
from tailsieve.model.spec_keys import SPEC_KEYS, SpecContext, spec_from_mapping
from tailsieve.model.spec_records import Bracket, Family
from tailsieve.model.speculative import PoolSpec, SpecConfig

BRACKET_WORDS = (*(b.value for b in Bracket), "default")  # default: the method's uncalibrated constants


def parse_spec(text: str, where: str, context: SpecContext | None = None) -> SpecConfig:
    """`NAME[:BRACKET][:TOKENS][,key=value…]` (keys: acceptance, decay, draft_cost, verify_cost, draft_share,
    token_cost, token_cost_slope, acceptance_slope), e.g. `mtp:5,acceptance=0.8`. NAME is a method; `mtp` and
    `dflash` are their calibrated profiles (`model/spec_calibration.py`: the central one for the context's family,
    or the context's fitted server; `mtp:low`, `mtp:high`, `mtp-moe`, `dflash-dense:high`; `mtp:default` the
    method's plain constants); or a `profile` model file with a concurrency fit (`spec.json`, `model/spec_fit.py`):
    its constants and measured depth, the given keys on top."""
    ctx = context or SpecContext()
    head, *opts = [p.strip() for p in text.split(",")]
    name, *parts = [p.strip() for p in head.split(":")]
    bracket = next((p.lower() for p in parts if p.lower() in BRACKET_WORDS), None)
    tokens = [p for p in parts if p.lower() not in BRACKET_WORDS]
    if len(tokens) > 1 or len(parts) - len(tokens) > 1:
        raise ConfigError(f"{where}: expected NAME[:BRACKET][:TOKENS], got {head!r}")
    base = _base(name, bracket, ctx, where)
    obj: dict[str, Any] = {"method": name if base is None else base.method.value}
    if tokens:
        try:  # ASCII digits, bounded before conversion: `mtp:٣` and `mtp:1_0` are refused, not read as 3 and 10
            obj["tokens"] = ascii_int(tokens[0], "tokens")
        except ConfigError:
            raise ConfigError(f"{where}: tokens must be an integer, got {excerpt(tokens[0])} in "
                              f"{excerpt(text)}") from None
    for opt in opts:
        key, eq, value = opt.partition("=")
        if not eq or key.strip() not in SPEC_KEYS[2:]:
            raise ConfigError(f"{where}: expected key=value with key in {', '.join(SPEC_KEYS[2:])}, got {excerpt(opt)}")
        if key.strip() in obj:
            raise ConfigError(f"{where}: key {key.strip()} is given twice in {excerpt(text)}")
        try:
            obj[key.strip()] = ascii_float(value, key.strip())
        except ConfigError:
            raise ConfigError(f"{where}: {key.strip()} must be a number, got {excerpt(value.strip())}") from None
    try:
        spec = spec_from_mapping(obj, where)
    except ConfigError as exc:
        if "method must be one of" not in str(exc):
            raise
        raise ConfigError(f"{exc}, or a profile: {profile_names()}") from None
    if base is None:
        return spec
    try:
        return replace(base, **{k: v for k, v in obj.items() if k != "method"})
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _base(name: str, bracket: str | None, ctx: SpecContext, where: str) -> SpecConfig | None:
    """The configuration NAME[:BRACKET] stands for before tokens and keys: a profile model file's fit, a calibrated
    profile (or the context's fit), or None for a plain method (its defaults)."""
    if name.lower().endswith(".json"):
        if bracket is not None:
            raise ConfigError(f"{where}: a model file's fit takes no bracket, got {bracket!r}")
        return spec_from_profile_file(Path(name))
    method_text, _, family_text = name.lower().partition("-")
    method = next((m for m in PROFILE_METHODS if m.value == method_text), None)
    if method is None or (family_text and family_text not in {f.value for f in Family}):
        if bracket not in (None, "default"):
            names = ", ".join(m.value for m in PROFILE_METHODS)
            raise ConfigError(f"{where}: no published range for {excerpt(name)} (calibrated: {names}, -dense, -moe)")
        return None
    if bracket == "default":
        return SpecConfig(method)
    family = Family(family_text) if family_text else ctx.family
    chosen = Bracket(bracket) if bracket else Bracket.CENTRAL
    if chosen is Bracket.CENTRAL and not family_text and ctx.fitted is not None and ctx.fitted.method is method:
        return ctx.fitted
    return profile(method, family, chosen).spec


def read_config(path: Path) -> dict[str, Any]:
    """A config file's document (TOML, or JSON by suffix), checked at the boundary: UTF-8, size and nesting limits,
    a table with only the keys `spec` and `launch`; errors are one line naming the file."""
    doc: Any = load_document(path, "config file", ConfigError)
    if not isinstance(doc, dict):
        raise ConfigError(f"config {path}: must be a table/object with a 'spec' table")
    extra = sorted(set(doc) - {"spec", "launch"})  # [launch]: engines/launch/config.py reads it
    if extra:
        raise ConfigError(f"config {path}: unknown key {extra[0]} (valid: spec, launch)")
    for table in ("spec", "launch"):
        if not isinstance(doc.get(table, {}), dict):
            raise ConfigError(f"config {path}: {table} must be a table, got {excerpt(doc[table])}")
    return doc


def load_config_file(path: Path) -> PoolSpec:
    """A simulate config file (TOML, or JSON by suffix): tables `spec.tail` and `spec.bulk` (docs/speculative.md)."""
    doc = read_config(path)
    spec = doc.get("spec", {})
    extra = sorted(set(spec) - {"tail", "bulk"})
    if extra:
        raise ConfigError(f"config {path}: unknown key spec.{extra[0]} (valid: spec.tail, spec.bulk)")
    try:
        return PoolSpec(tail=spec_from_mapping(spec.get("tail", {}), "spec.tail"),
                        bulk=spec_from_mapping(spec.get("bulk", {}), "spec.bulk"))
    except ConfigError as exc:
        raise ConfigError(f"config {path}: {exc}") from None


def spec_range(text: str, context: SpecContext | None = None) -> tuple[tuple[str, SpecConfig], ...]:
    """The published range a `--spec` text stands in: for a calibrated method without key overrides (`mtp`,
    `dflash-moe:high`, …) its low, central and high profiles (the central one replaced by the context's fit, labelled
    `your fit`, with the built-in central beside it); empty for anything else (a plain method, keys, a model file)."""
    ctx = context or SpecContext()
    head, *opts = [p.strip() for p in text.split(",")]
    name, *parts = [p.strip().lower() for p in head.split(":")]
    method_text, _, family_text = name.partition("-")
    method = next((m for m in PROFILE_METHODS if m.value == method_text), None)
    if opts or method is None or "default" in parts or (family_text and family_text not in {f.value for f in Family}):
        return ()
    family = Family(family_text) if family_text else ctx.family
    out = [(b.value, profile(method, family, b).spec) for b in Bracket]
    if not family_text and ctx.fitted is not None and ctx.fitted.method is method:
        out.insert(0, ("your fit", ctx.fitted))
    return tuple(out)
