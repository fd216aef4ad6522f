"""Speculation settings from text and files (§3.4): `parse_spec` reads `METHOD[:TOKENS][,key=value…]` flags and
built-in or fitted profiles, `spec_from_mapping` a config-file table, `load_config_file` a simulate config's
`spec.tail` / `spec.bulk` tables; every error is one line naming where (`model/speculative.py` holds the model they
build)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from tailsieve.errors import ConfigError
from tailsieve.inputs import excerpt, load_document
from tailsieve.model.speculative import MAX_TOKENS, PoolSpec, SpecConfig, SpecMethod, method_names

SPEC_KEYS = ("method", "tokens", "acceptance", "decay", "draft_cost", "verify_cost", "draft_share", "token_cost",
             "token_cost_slope", "acceptance_slope")


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


def parse_spec(text: str, where: str) -> SpecConfig:
    """`METHOD[:TOKENS][,key=value…]` (keys: acceptance, decay, draft_cost, verify_cost, draft_share, token_cost,
    token_cost_slope, acceptance_slope), e.g. `mtp:5,acceptance=0.8`; METHOD may also be a built-in profile
    (`mtp-qwen`, `model/spec_calibration.py`) or a `profile` model file with a concurrency fit (`spec.json`,
    `model/spec_fit.py`): its fitted constants and measured depth, the given keys on top."""
    head, *opts = [p.strip() for p in text.split(",")]
    method, _, tokens = head.partition(":")
    profile = _profile(method)
    obj: dict[str, Any] = {"method": method if profile is None else profile.method.value}
    if tokens:
        try:
            obj["tokens"] = int(tokens)
        except ValueError:
            raise ConfigError(f"{where}: tokens must be an integer, got {excerpt(tokens)} in {excerpt(text)}") from None
    for opt in opts:
        key, eq, value = opt.partition("=")
        if not eq or key.strip() not in SPEC_KEYS[2:]:
            raise ConfigError(f"{where}: expected key=value with key in {', '.join(SPEC_KEYS[2:])}, got {excerpt(opt)}")
        try:
            obj[key.strip()] = float(value)
        except ValueError:
            raise ConfigError(f"{where}: {key.strip()} must be a number, got {excerpt(value.strip())}") from None
    try:
        spec = spec_from_mapping(obj, where)
    except ConfigError as exc:
        if "method must be one of" not in str(exc):
            raise
        from tailsieve.model.spec_calibration import profile_names

        raise ConfigError(f"{exc}, or a profile: {profile_names()}") from None
    if profile is None:
        return spec
    try:
        return replace(profile, **{k: v for k, v in obj.items() if k != "method"})
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _profile(name: str) -> SpecConfig | None:
    """A built-in speculation profile by name, or a `profile` model file's fit (`NAME.json`; imported here: both are
    built from this module)."""
    if name.strip().lower().endswith(".json"):
        from tailsieve.model.spec_fit import spec_from_profile_file

        return spec_from_profile_file(Path(name.strip()))
    from tailsieve.model.spec_calibration import lookup

    return lookup(name)


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
