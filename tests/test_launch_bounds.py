"""Launch config bounds (issue 41 item 8): every bounded `[launch]` number below, at and above each end of its range
(plus the reported values: grace 1e300, retries 10^20, memory 1e308, start-up timeout 1e-300, cores 0-1000000), a NUL
byte in each text that becomes argv or environment (refused when the config is read, so `--dry-run` refuses it too),
and `--dry-run` printing each replica's environment with secret-looking values redacted. Generated cases, run
through `launch_from_mapping` (the one builder of TOML tables, flags and code) and in-process through the CLI.
"""

from __future__ import annotations

import contextlib
import io
import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from hostile_harness import run_case, scratch, write
from tailsieve.cli import main
from tailsieve.engines.launch.bounds import BOUNDS, MAX_CORE_ID, MAX_CPU_MEMORY_GIB
from tailsieve.engines.launch.config import launch_from_mapping
from tailsieve.errors import ConfigError
from tailsieve.model.speculative import SpecConfig

NONE = SpecConfig()


def build(**launch: Any) -> Any:
    return launch_from_mapping({"model": "m", "replicas": 2} | launch, NONE, NONE)


def _cases() -> list[tuple[str, Any, bool]]:
    """(key, value, accepted) for each bounded key: both ends (accepted), just outside each, and hostile values."""
    out: list[tuple[str, Any, bool]] = []
    for key, b in BOUNDS.items():
        step = 1 if b.integer else max(b.lo / 2, 1e-3) if b.lo > 0 else 1e-3
        lo, hi = (int(b.lo), int(b.hi)) if b.integer else (b.lo, b.hi)
        out += [(key, lo, True), (key, hi, True), (key, lo - step, False), (key, hi + step, False)]
        out += [(key, v, False) for v in (10**20, 1e300, -1, float("nan"), float("inf"), True, "5")]
        if not b.integer:
            out += [(key, 1e-300, b.lo == 0), (key, (lo + hi) / 2, True)]
    return out


CASES = _cases()


@pytest.mark.parametrize(("key", "value", "accepted"), CASES, ids=[f"{k}={v!r}" for k, v, _ in CASES])
def test_each_bounded_key_at_and_past_its_ends(key: str, value: Any, accepted: bool) -> None:
    b = BOUNDS[key]
    if accepted:
        assert getattr(build(**{key: value}), key) == value
        return
    with pytest.raises(ConfigError) as exc:
        build(**{key: value})
    msg = str(exc.value)
    rng = f"{b.lo:g}..{b.hi:g}" if b.integer else f"[{b.lo:g}, {b.hi:g}]"
    assert msg.startswith(f"launch.{key} must be {'an integer' if b.integer else 'a number'} in {rng}"), msg
    assert len(msg) < 200, msg


MEMORY = [(1, True), (2, True), (MAX_CPU_MEMORY_GIB, True), (MAX_CPU_MEMORY_GIB + 1, False), (1e308, False),
          (10**20, False), (10**400, False), (float("nan"), False), (float("inf"), False), (0.5, False), (-1, False)]
GPU_MEMORY = [(0.5, True), (1, True), (0, False), (1.01, False), (10**400, False), (float("nan"), False)]


@pytest.mark.parametrize(("value", "accepted"), MEMORY, ids=[repr(v)[:8] for v, _ in MEMORY])
def test_cpu_memory_is_bounded(value: float, accepted: bool) -> None:
    if accepted:
        assert build(memory=value).memory == value
        return
    with pytest.raises(ConfigError, match=r"launch\.memory on cpu"):
        build(memory=value)


@pytest.mark.parametrize(("value", "accepted"), GPU_MEMORY, ids=[repr(v)[:8] for v, _ in GPU_MEMORY])
def test_gpu_memory_is_a_share(value: float, accepted: bool) -> None:
    if accepted:
        assert build(device="gpu", memory=value).memory == value
        return
    with pytest.raises(ConfigError, match=r"launch\.memory on gpu is a share of GPU memory in \(0, 1\]"):
        build(device="gpu", memory=value)


CORES = [("0", True), (str(MAX_CORE_ID), True), ("0-3:2", True), (f"0-{MAX_CORE_ID}", True),
         (str(MAX_CORE_ID + 1), False), ("0-1000000", False), ("5-2", False), ("0-3:0", False),
         (f"1,{MAX_CORE_ID + 1}", False)]


@pytest.mark.parametrize(("cores", "accepted"), CORES, ids=[c for c, _ in CORES])
def test_core_lists_are_bounded(cores: str, accepted: bool) -> None:
    if accepted:
        assert build(cores=[cores, "1"]).places == (cores, "1")
        return
    with pytest.raises(ConfigError, match=r"launch\.cores: ") as exc:
        build(cores=[cores, "1"])
    assert len(str(exc.value)) < 200


NUL_FIELDS: dict[str, dict[str, Any]] = {
    "model": {"model": "m\0x"},
    "served_model_name": {"served_model_name": "n\0"},
    "args[0]": {"args": ["--flag\0evil"]},
    "command[0]": {"command": ["python\0", "-m", "x"]},
    "env.X": {"env": {"X": "a\0b"}},
    "tail.args[0]": {"tail": {"args": ["\0"]}},
    "bulk.args[0]": {"bulk": {"args": ["x", "\0y"]}},
}


@pytest.mark.parametrize("field", sorted(NUL_FIELDS))
def test_a_nul_byte_is_refused_when_the_config_is_read(field: str) -> None:
    with pytest.raises(ConfigError, match=r"NUL byte"):
        build(**NUL_FIELDS[field])


NUL_FLAGS = [["--model", "m\0"], ["--served-model-name", "n\0"], ["--server-args", "--x \0"],
             ["--tail-args", "a\0"], ["--bulk-args", "\0"]]


@pytest.mark.parametrize("where", ["config", "flag"])
@pytest.mark.parametrize("case", range(len(NUL_FIELDS)))
def test_dry_run_refuses_a_nul_in_one_line(where: str, case: int) -> None:
    """The CLI: a NUL in a JSON config's text or in a flag is refused by `--dry-run` in one line, nothing printed."""
    with scratch() as root:
        if where == "config":
            field = sorted(NUL_FIELDS)[case]
            cfg = write(root, "c.json", json.dumps({"launch": {"model": "m"} | NUL_FIELDS[field]}).encode())
            argv = ["launch", "--config", cfg]
        else:
            argv = ["launch", "--model", "m", *NUL_FLAGS[case % len(NUL_FLAGS)]]
        rc, err = run_case("launch nul", [*argv, "--dry-run", "--out", str(root / "o")], root)
        assert rc == 1 and "holds a NUL byte" in err, err


REPORTED = {"grace_s": 1e300, "restart_retries": 10**20, "memory": 1e308, "startup_timeout_s": 1e-300}


@pytest.mark.parametrize("key", sorted(REPORTED))
def test_the_reported_values_are_refused_by_dry_run(key: str) -> None:
    with scratch() as root:
        cfg = write(root, "c.json", json.dumps({"launch": {"model": "m", key: REPORTED[key]}}).encode())
        rc, err = run_case("launch bounds", ["launch", "--config", cfg, "--dry-run", "--out", str(root / "o")], root)
        assert rc == 1 and f"launch.{key}" in err and " in " in err, err


SECRET_NAMES = ("HF_TOKEN", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "api_key", "GCP_CREDENTIALS")
PLAIN_NAMES = ("LD_PRELOAD", "VLLM_LOGGING_LEVEL", "MAX_TOKENS", "TOKENS", "KEYBOARD")


def _dry_run(root: Path, env: dict[str, str], args: list[str] | None = None) -> str:
    doc = {"launch": {"model": "m", "replicas": 2, "env": env} | ({"args": args} if args else {})}
    cfg = write(root, "c.json", json.dumps(doc).encode())
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["launch", "--config", cfg, "--dry-run", "--out", str(root / "o")]) == 0
    return out.getvalue()


@pytest.mark.parametrize("name", SECRET_NAMES + PLAIN_NAMES)
def test_dry_run_prints_each_replicas_environment(name: str) -> None:
    value = "v4lue with space/s" if name in PLAIN_NAMES else "s3cr3t-value-9f8e"
    with scratch() as root:
        text = _dry_run(root, {name: value})
    env_lines = [ln for ln in text.splitlines() if ln.startswith("# replica")]
    assert len(env_lines) == 2
    for line in env_lines:
        shown = line.split("  env: ", 1)[1]
        if name in SECRET_NAMES:
            assert f"{name}=[redacted]" in shown and value not in text
        else:
            assert f"{name}={shlex.quote(value)}" in shown


def test_dry_run_redacts_secrets_the_kind_shows_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """HF_* variables of the caller's environment are shown (the kind's prefixes); a token among them is not."""
    monkeypatch.setenv("HF_TOKEN", "hf_callers_own_token_123")
    monkeypatch.setenv("HF_HOME", "/data/hf")
    with scratch() as root:
        text = _dry_run(root, {"X": "Bearer abcdefgh123"})
    assert "hf_callers_own_token_123" not in text and "HF_TOKEN=[redacted]" in text
    assert "HF_HOME=/data/hf" in text and "abcdefgh123" not in text


def test_shell_metacharacters_reach_argv_literally() -> None:
    """No shell anywhere: each argument is one argv element, shown shell-quoted by the dry run."""
    hostile = ["$(touch /tmp/pwned)", "a;b", "`id`", "x | y", "'q'"]
    with scratch() as root:
        text = _dry_run(root, {}, args=hostile)
    cmd = next(ln for ln in text.splitlines() if not ln.startswith("#"))
    assert shlex.split(cmd)[-len(hostile):] == hostile
