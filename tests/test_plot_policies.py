"""`simulate --plot` draws TailSieve, verl's balancer and the best static split in hindsight by default, others on
request (`--plot-policies`; issue 50, item 6)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tailsieve.cli import main
from tailsieve.cli.simulate_cmd import PLOTTED, plotted
from tailsieve.errors import ConfigError
from tailsieve.loop import PolicyRun

SMALL = ["--groups", "8", "--group-size", "4", "--replicas", "4", "--steps", "4", "--replications", "1"]
RAN = ("uniform", "topq-best", "static", "tailsieve", "april-partial", "verl-lif")


def _runs(names: tuple[str, ...] = RAN) -> dict[str, PolicyRun]:
    return {n: PolicyRun(n, (), (), ()) for n in names}


def test_the_default_is_tailsieve_the_balancer_and_the_best_static_split() -> None:
    assert PLOTTED == ("tailsieve", "verl-lif", "topq-best")
    assert list(plotted(_runs(), None)) == ["tailsieve", "verl-lif", "topq-best"]
    assert list(plotted(_runs(("uniform", "static")), None)) == ["uniform", "static"]  # none of them ran: all
    assert list(plotted(_runs(), "all")) == list(RAN)
    assert list(plotted(_runs(), "static, uniform,static")) == ["static", "uniform"]


@pytest.mark.parametrize(("request_", "error"), [
    ("nope,uniform", "--plot-policies: nope did not run; ran: uniform, topq-best, static, tailsieve, april-partial, "
                     "verl-lif"),
    (" , ", "--plot-policies is empty; give policy names or all"),
])
def test_a_bad_request_is_one_line(request_: str, error: str) -> None:
    with pytest.raises(ConfigError) as e:
        plotted(_runs(), request_)
    assert str(e.value) == error


def test_the_cli_draws_the_default_and_refuses_a_request_without_a_plot(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "sim.png"
    assert main(["simulate", *SMALL, "--plot", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert main(["simulate", *SMALL, "--plot", str(png), "--plot-policies", "uniform,april-drop"]) == 0
    capsys.readouterr()
    assert main(["simulate", *SMALL, "--plot-policies", "all"]) == 1
    assert capsys.readouterr().err.strip() == (
        "tailsieve simulate: error: --plot-policies chooses what --plot draws; add --plot FILE")
