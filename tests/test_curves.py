"""τ(b) tables: interpolation, extrapolation, validation messages, files and built-ins."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from conftest import DATA, make_curve
from tailsieve.errors import CurveError
from tailsieve.model.costmodel import model_from_json
from tailsieve.model.curve_names import load_curve
from tailsieve.model.curves import MAX_CURVE_POINTS, builtin_curves, read_curve_file


def test_table_interpolates_and_extrapolates() -> None:
    c = make_curve(batch=(2, 4), tpot_ms=(10.0, 14.0))
    t = c.table(8) * 1000
    assert t[0] == 0.0
    assert t[1] == pytest.approx(10.0)  # flat below the first point
    assert t[2] == pytest.approx(10.0)
    assert t[3] == pytest.approx(12.0)
    assert t[4] == pytest.approx(14.0)
    assert t[6] == pytest.approx(18.0)  # slope 2 ms per request past the last point
    assert t[8] == pytest.approx(22.0)


def test_extrapolation_never_below_last_value() -> None:
    c = make_curve(batch=(1, 2), tpot_ms=(10.0, 8.0))
    t = c.table(5) * 1000
    assert list(t[2:]) == pytest.approx([8.0] * 4)


def test_single_point_is_constant() -> None:
    c = make_curve(batch=(4,), tpot_ms=(5.0,))
    assert list(c.table(6)[1:] * 1000) == pytest.approx([5.0] * 6)


def test_table_is_read_only_and_consistent_across_sizes() -> None:
    c = make_curve()
    small, big = c.table(10), c.table(1000)
    assert np.array_equal(small, big[:11])
    with pytest.raises(ValueError):
        small[1] = 3.0


@pytest.mark.parametrize(
    ("batch", "tpot", "message"),
    [
        ((), (), "at least one"),
        ((1, 2), (1.0,), "2 batch sizes but 1 tpot_ms"),
        ((0, 2), (1.0, 2.0), "must be positive, got 0"),
        ((2, 2), (1.0, 2.0), "strictly increasing, got 2 then 2"),
        ((1, 3, 2), (1.0, 2.0, 3.0), "strictly increasing, got 3 then 2"),
        ((1,), (0.0,), "positive and finite, got 0.0"),
        ((1,), (float("inf"),), "positive and finite, got inf"),
        ((1,), (float("nan"),), "positive and finite, got nan"),
    ],
)
def test_validation_messages(batch: tuple[int, ...], tpot: tuple[float, ...], message: str) -> None:
    with pytest.raises(CurveError, match=message.replace("(", r"\(")):
        make_curve(batch=batch, tpot_ms=tpot)


def test_the_point_limit_is_the_curve_s_own() -> None:
    """100,000 points build, 100,001 do not: the limit lives in the curve, so every file kind and command has it."""
    n = MAX_CURVE_POINTS
    assert len(make_curve(batch=tuple(range(1, n + 1)), tpot_ms=(1.0,) * n).batch) == n
    with pytest.raises(CurveError, match="100,001 points, more than the 100,000 allowed"):
        make_curve(batch=tuple(range(1, n + 2)), tpot_ms=(1.0,) * (n + 1))
    with pytest.raises(CurveError, match="100,001 points"):
        model_from_json({"batch": list(range(1, n + 2)), "tpot_ms": [1.0] * (n + 1), "cost_model": {}}, "m.json")


def test_json_and_csv_files(tmp_path: Path) -> None:
    j = tmp_path / "c.json"
    j.write_text(json.dumps({"batch": [1, 8], "tpot_ms": [5, 9.5], "meta": "ok"}))
    s = tmp_path / "c.csv"
    s.write_text("batch,tpot_ms\n1,5\n8,9.5\n")
    for path in (j, s):
        c = load_curve(str(path))
        assert c.batch == (1, 8)
        assert c.tpot_ms == (5.0, 9.5)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("a.json", "{not json", "invalid JSON at line 1"),
        ("b.json", '{"batch": [1]}', "'batch' and 'tpot_ms'"),
        ("c.json", '{"batch": [1.5], "tpot_ms": [2]}', "integers, got 1.5"),
        ("d.json", '{"batch": [1], "tpot_ms": ["x"]}', "must be a number, got 'x'"),
        ("e.csv", "b,t\n1,2\n", "header must contain 'batch,tpot_ms'"),
        ("f.csv", "", "empty file"),
        ("g.csv", "batch,tpot_ms\n1\n", "line 2 has 1 fields"),
        ("h.csv", "batch,tpot_ms\n4,2\n2,3\n", "strictly increasing, got 4 then 2"),
    ],
)
def test_bad_files(tmp_path: Path, name: str, text: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(CurveError, match=message.replace("(", r"\(")) as err:
        read_curve_file(path)
    assert "\n" not in str(err.value)


def test_unknown_curve_names_the_builtins() -> None:
    with pytest.raises(CurveError, match="unknown curve 'nope'.*h100-llama3-8b"):
        load_curve("nope")


def test_builtins_match_published_points() -> None:
    curves = builtin_curves()
    for name in ("h100-llama3-8b", "h100-llama3-8b-short", "a100-llama3-8b", "h100-llama2-70b-tp8"):
        assert name in curves
        assert curves[name].extension
    h100 = curves["h100-llama3-8b"]
    assert h100.tpot_s(64) == pytest.approx(0.018368)
    assert h100.tpot_s(16) == pytest.approx(0.010766)
    # past b=64: linear along the last two points (12.751 @ 32, 18.368 @ 64)
    assert h100.tpot_s(128) * 1000 == pytest.approx(18.368 + 64 * (18.368 - 12.751) / 32)
    assert curves["h100-llama2-70b-tp8"].tpot_s(2) == pytest.approx(0.030262)
    assert not curves["h100-llama2-70b-tp8"].is_monotone
    assert h100.is_monotone


# ------------------------------------------------------------------------------------- MoE curves (issue 22, item 4)

THROUGHPUT = DATA / "throughput"  # excerpts of shared/data/throughput (tests/data/README.md)
MIXTRAL_CSV = THROUGHPUT / "argonne_mixtral_8x7b_step_ms.csv"
MOE_KERNEL_CSV = THROUGHPUT / "aiconfigurator_h200_vllm019_moe_layer_ms.csv"
MOE_CURVES = {  # curve → (hardware, engine) rows of the shared file, in = out = 1024
    "a100x4-mixtral-8x7b": ("Nvidia A100 GPU", "vLLM"),
    "h100x4-mixtral-8x7b": ("Nvidia H100 GPU", "TensorRT-LLM"),
}


def shared_rows(path: Path) -> list[dict[str, str]]:
    """The rows of a CSV excerpt in tests/data."""
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def first_rows(hardware: str, engine: str) -> list[dict[str, str]]:
    """Mixtral rows of one (hardware, engine) at in = out = 1024: the first row of each batch size, in file order."""
    out: dict[int, dict[str, str]] = {}
    for r in shared_rows(MIXTRAL_CSV):
        if (r["hardware"], r["engine"], r["in_eq_out_len"], r["num_gpus"]) == (hardware, engine, "1024", "4"):
            out.setdefault(int(r["batch"]), r)
    return [out[b] for b in sorted(out)]


@pytest.mark.parametrize("name", sorted(MOE_CURVES))
def test_moe_curves_equal_the_shared_rows(name: str) -> None:
    """Points = the file's step_ms_incl_prefill (= latency_s / 1024 × 1000, 3 decimals), first row per batch."""
    rows = first_rows(*MOE_CURVES[name])
    c = builtin_curves()[name]
    assert c.batch == tuple(int(r["batch"]) for r in rows) == (1, 16, 32, 64)
    assert c.tpot_ms == tuple(float(r["step_ms_incl_prefill"]) for r in rows)
    assert c.tpot_ms == tuple(round(float(r["latency_s"]) / 1024 * 1000, 3) for r in rows)
    assert all(r["model"] == "mistralai/Mixtral-8x7B-v0.1" for r in rows)
    slope = (c.tpot_ms[3] - c.tpot_ms[2]) / 32
    assert c.tpot_s(128) * 1000 == pytest.approx(c.tpot_ms[3] + 64 * slope)
    assert f"+{slope:.3f} ms per request past b=64" in c.extension
    assert c.licence == "BSD-3-Clause" and "LLM-Inference-Bench" in c.source
    assert "prefill" in c.derivation and c.is_monotone


def test_moe_curves_reproduce_the_quoted_figures() -> None:
    """Issue 22 quotes 10.2 / 23.9 / 28.1 / 33.9 ms for A100×4 vLLM; the duplicate b = 1 row (10.102) is not used."""
    curves = builtin_curves()
    assert curves["a100x4-mixtral-8x7b"].tpot_ms == (10.2, 23.901, 28.087, 33.931)
    assert tuple(round(t, 1) for t in curves["a100x4-mixtral-8x7b"].tpot_ms) == (10.2, 23.9, 28.1, 33.9)
    assert curves["h100x4-mixtral-8x7b"].tpot_ms == (5.747, 7.209, 8.457, 11.013)
    a100 = [r for r in shared_rows(MIXTRAL_CSV) if (r["hardware"], r["engine"], r["in_eq_out_len"], r["batch"])
            == ("Nvidia A100 GPU", "vLLM", "1024", "1")]
    assert [float(r["step_ms_incl_prefill"]) for r in a100] == [10.2, 10.102]


def test_flattened_mixtral_file_matches_the_argonne_csv() -> None:
    """The flattened file holds exactly the Argonne All_results rows (sorted by batch size), and the b = 1 row it
    lists first (the one the curve keeps) is also the first in the Argonne file."""
    src = [r for r in shared_rows(THROUGHPUT / "argonne_all_results_mixtral_rows.csv")
           if r["Model"] == "mistralai/Mixtral-8x7B-v0.1" and r["Num of Hardware"] == "4"
           and r["Input Output Length"] == "1024"
           and (r["Hardware"], r["Framework"]) in MOE_CURVES.values()]
    flat = [r for r in shared_rows(MIXTRAL_CSV)
            if r["in_eq_out_len"] == "1024" and (r["hardware"], r["engine"]) in MOE_CURVES.values()]
    key_src = sorted((r["Hardware"], r["Framework"], int(r["Batch Size"]), float(r["Latency"])) for r in src)
    key_flat = sorted((r["hardware"], r["engine"], int(r["batch"]), float(r["latency_s"])) for r in flat)
    assert len(src) == 9 and key_src == key_flat  # A100 vLLM: 5 rows (b = 1 twice); H100 TensorRT-LLM: 4
    first = next(r for r in src if (r["Hardware"], r["Batch Size"]) == ("Nvidia A100 GPU", "1"))
    assert float(first["Latency"]) / 1024 * 1000 == pytest.approx(10.2, abs=5e-4)


def moe_levels(shape: str, distribution: str) -> dict[tuple[str, str], dict[int, float]]:
    """Per (dtype, MoE TP): kernel latency per token count, relative to the 128-token latency."""
    out: dict[tuple[str, str], dict[int, float]] = {}
    for r in shared_rows(MOE_KERNEL_CSV):
        if r["model_shape"] == shape and r["distribution"] == distribution:
            out.setdefault((r["moe_dtype"], r["moe_tp_size"]), {})[int(r["num_tokens"])] = float(
                r["latency_ms_per_layer"])
    return {k: {n: v / t[128] for n, v in t.items()} for k, t in out.items()}


def test_moe_kernel_knee_of_a_128_expert_model() -> None:
    """docs/workloads.md's sentence: a 128-expert top-8 layer (Qwen3-30B-A3B shape, H200) rises up to 16 tokens
    (= 128 / 8) with balanced routing and is flat from there to 128; with power-law routing the knee is 32–64."""
    balanced = moe_levels("Qwen3-30B-A3B", "balanced")
    assert len(balanced) == 6  # bf16 / fp8 × MoE TP 1, 2, 4
    for rel in balanced.values():
        assert rel[1] <= 0.27 and rel[8] <= 0.63 and rel[16] >= 0.90
        assert all(0.90 <= rel[n] <= 1.01 for n in (16, 32, 48, 64, 96, 128))
    for dist in ("power_law_1.01", "power_law_1.2"):
        for rel in moe_levels("Qwen3-30B-A3B", dist).values():
            assert rel[16] <= 0.66 and 0.76 <= rel[32] <= 0.86 and rel[64] >= 0.80
    for rel in moe_levels("Mixtral-8x7B", "balanced").values():  # 8 experts, top-2: the knee at 4 tokens
        assert rel[1] <= 0.8 * rel[4] and all(0.9 * rel[4] <= rel[n] <= 1.1 * rel[4] for n in (8, 16, 32))


def test_a_scaled_curve_is_every_point_times_the_factor() -> None:
    curve = load_curve("h100-llama3-8b")
    slow = curve.scaled(1.5)
    assert slow.batch == curve.batch and slow.name == "h100-llama3-8bx1.5"
    np.testing.assert_allclose(slow.table(300), 1.5 * curve.table(300))  # the extension past b = 64 follows
    assert curve.scaled(1.0) is curve
