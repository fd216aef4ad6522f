"""τ(b) tables: interpolation, extrapolation, validation messages, files and built-ins."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import make_curve
from tailsieve.errors import CurveError
from tailsieve.model.curves import builtin_curves, load_curve, read_curve_file


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
