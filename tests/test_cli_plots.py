"""Every --plot (cli/_plots.py): a distinct look per policy with tailsieve emphasized, the legend outside the data,
and one line saying where the figure went."""

from __future__ import annotations

from pathlib import Path

import pytest

from tailsieve.cli import main
from tailsieve.cli._plots import legend_outside, policy_styles, pyplot
from tailsieve.simulation.runs import ORACLES, policy_names


def test_every_policy_looks_different_and_tailsieve_stands_out() -> None:
    names = list(policy_names())
    style = policy_styles(names, dashed=ORACLES)
    looks = {(s.color, s.linestyle, s.marker) for s in style.values()}
    assert len(looks) == len(names) == 14
    assert len({s.color for s in style.values()}) == len(names)  # colours alone already tell them apart
    head = style["tailsieve"]
    assert head.color == "black" and head.linewidth > max(s.linewidth for n, s in style.items() if n != "tailsieve")
    assert head.zorder > max(s.zorder for n, s in style.items() if n != "tailsieve")
    assert all(style[n].linestyle == "--" for n in ORACLES)
    assert all(s.linestyle != "--" for n, s in style.items() if n not in ORACLES)
    assert style["uniform"].color != style["april-drop"].color  # the two solid blues


def test_legend_sits_right_of_the_axes() -> None:
    plt = pyplot()
    fig, ax = plt.subplots()
    for i in range(5):
        ax.plot([0, 1], [i, i + 1], label=f"p{i}")
    legend_outside(ax)
    fig.canvas.draw()
    box, axes = ax.get_legend().get_window_extent(), ax.get_window_extent()
    assert box.x0 >= axes.x1
    plt.close(fig)


@pytest.mark.parametrize("argv", [
    ["simulate", "--groups", "8", "--group-size", "4", "--replicas", "4", "--steps", "4"],
    ["oracle", "--sample", "8", "--repeat", "3"],
    ["analyze", "synthetic-math", "--prompts", "16", "--checkpoints", "2", "--samples", "2"],
])
def test_every_plot_says_where_it_wrote(argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "p.png"
    assert main([*argv, "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == f"plot saved to {png}" and png.read_bytes()[:4] == b"\x89PNG"
    assert main([*argv, "--plot", str(png), "--json"]) == 0  # stdout stays one JSON document
    cap = capsys.readouterr()
    assert cap.out.lstrip().startswith("{") and cap.err == f"plot saved to {png}\n"
