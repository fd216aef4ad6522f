"""`tailsieve profile` says how long is left and keeps what it measured when interrupted (issue 50, item 5;
`cli/profile_cmd.py`: `Estimate`, `write_partial`), on the fake server."""

from __future__ import annotations

import json
import math
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine_fake import FakeServer
from tailsieve.cli import main
from tailsieve.cli.profile_cmd import Estimate
from tailsieve.engines.measure.profile import DEFAULT_BATCHES, DEFAULT_CONTEXTS
from tailsieve.model.curve_names import load_curve


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with FakeServer() as s:
        yield s


def test_the_estimate_prices_the_work_left_at_the_rate_so_far() -> None:
    e = Estimate((1, 16), (0, 800), 100)
    e.start = 0.0
    work = [8 * 100, 8 * 200, 16 * 100, 16 * 200]  # max(b, 8) · (max_tokens + c / 8), batch-major
    assert e.work == work
    assert math.isnan(e.seconds_left(0, now=5.0))
    assert e.seconds_left(1, now=4.0) == pytest.approx(4.0 * sum(work[1:]) / work[0])
    assert e.seconds_left(3, now=30.0) == pytest.approx(30.0 * work[3] / sum(work[:3]))
    assert e.left(4) == "done"


def test_the_default_schedule_is_the_documented_one() -> None:
    """docs/profile.md gives the run time of exactly this schedule on the tiny CPU model."""
    assert (DEFAULT_BATCHES, DEFAULT_CONTEXTS) == ((1, 2, 4, 8, 16, 32, 64), (0, 1024))
    doc = (Path(__file__).resolve().parents[1] / "docs" / "profile.md").read_text()
    assert "b = 1, 2, 4, 8, 16, 32, 64 at contexts 0 and 1024 (14 points" in " ".join(doc.split())


@pytest.mark.parametrize(("signum", "rc"), [(None, 130), (signal.SIGTERM, 143)])
def test_an_interrupt_keeps_the_points_measured(server: FakeServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str], signum: int | None,
                                                rc: int) -> None:
    real = Estimate.left

    def stop_after_three(self: Estimate, done: int) -> str:
        if done == 3:
            if signum is None:
                raise KeyboardInterrupt
            signal.raise_signal(signum)
        return real(self, done)

    monkeypatch.setattr(Estimate, "left", stop_after_three)
    out = tmp_path / "model.json"
    assert main(["profile", "--endpoint", server.url, "--batches", "1,2,4", "--max-tokens", "8", "--contexts",
                 "0,64", "--out", str(out)]) == rc
    how = "" if signum is None else " by SIGTERM"
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"tailsieve profile: interrupted{how}; the 3 of 6 points measured are in {out} (a τ(b) curve of 2 batch "
        "sizes; rerun for the context and prefill terms)")
    doc = json.loads(out.read_text())
    assert doc["complete"] is False and doc["planned_points"] == 6 and len(doc["points"]) == 3
    assert load_curve(str(out)).batch == (1, 2)  # batch-major: (1, 0), (1, 64), (2, 0); read as a curve


def test_an_interrupt_before_any_point_writes_nothing(server: FakeServer, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    def stop(*a: object, **k: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("tailsieve.engines.measure.profile.served_model", stop)
    out = tmp_path / "model.json"
    assert main(["profile", "--endpoint", server.url, "--out", str(out)]) == 130
    assert capsys.readouterr().err.strip().endswith(f"interrupted; nothing was measured; {out} was not written")
    assert not out.exists()
