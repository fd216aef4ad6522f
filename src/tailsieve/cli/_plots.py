"""What every `--plot` shares: one distinct colour and line style per policy (the headline policy emphasized), the
legend outside the data, and one line saying where the figure went. matplotlib is imported only when a figure is
drawn (`pyplot()`), so `tailsieve --help` never pays for it."""

from __future__ import annotations

import sys
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tailsieve.outputs import write_figure

HEADLINE = "tailsieve"
# 13 colours that stay apart (Tableau 10 without its grey, then 4 darker ones); black is the headline's alone.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf",
           "#393b79", "#637939", "#8c6d31", "#843c39")
DASHES = ("-", "-.", ":")  # "--" is the oracles' alone
MARKERS = ("o", "s", "^", "v", "D", "P", "X", "<", ">", "h", "*", "p", "d")


@dataclass(frozen=True, slots=True)
class Style:
    """One policy's look, the same in every panel of a figure."""

    color: str
    linestyle: str
    linewidth: float
    marker: str
    zorder: int

    def kwargs(self) -> dict[str, Any]:
        """matplotlib `plot` keywords (a marker every few points, so that lines that overlap stay apart)."""
        return {"color": self.color, "linestyle": self.linestyle, "linewidth": self.linewidth,
                "marker": self.marker, "markevery": 0.1, "markersize": 4, "zorder": self.zorder}


def policy_styles(names: Sequence[str], *, dashed: Collection[str] = (), headline: str = HEADLINE) -> dict[str, Style]:
    """A distinct (colour, marker) per name, in order (13 colours before one repeats, then with another marker and
    line style); the headline policy black, thick and on top; `dashed` names (the oracles) dashed, the others cycling
    through solid, dash-dot and dotted."""
    out: dict[str, Style] = {}
    others = [n for n in names if n != headline]
    for i, name in enumerate(others):
        style = "--" if name in dashed else DASHES[i % len(DASHES)]
        out[name] = Style(PALETTE[i % len(PALETTE)], style, 1.2, MARKERS[i % len(MARKERS)], 2)
    if headline in names:
        out[headline] = Style("black", "-", 2.6, "", 5)
    return {n: out[n] for n in names}


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def legend_outside(ax: Any, handles: list[Any] | None = None, labels: list[str] | None = None, *,
                   below: bool = False) -> None:
    """The legend to the right of the axes, clear of the data; `below` puts it under the x-axis label instead (a
    panel with a twin y-axis on the right, whose tick labels and label a legend there would cover)."""
    kw: dict[str, Any] = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "borderaxespad": 0.0, "fontsize": 7}
    if below:
        kw |= {"loc": "upper center", "bbox_to_anchor": (0.5, -0.2), "ncol": 4}
    if handles is not None:
        ax.legend(handles, labels, **kw)
    else:
        ax.legend(**kw)


def save_figure(fig: Any, path: Path, *, quiet: bool = False) -> None:
    """Save with the outside legend included, close, and say where (stdout; stderr when stdout carries JSON)."""
    import matplotlib.pyplot as plt

    write_figure(fig, path, bbox_inches="tight")
    plt.close(fig)
    print(f"plot saved to {path}", file=sys.stderr if quiet else sys.stdout, flush=True)
