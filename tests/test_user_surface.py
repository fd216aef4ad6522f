"""What a new user reads (issue 42): no path into the project's shared folder (absent from a clone) in the README,
the docs, the package's data or any `curves` output; `curves` within 120 columns; the paper cited with a link; and
errors that name only what the user asked for."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from tailsieve.cli import main
from tailsieve.model.curves import builtin_curves

ROOT = Path(__file__).resolve().parents[1]
SHARED = re.compile(r"\.\./shared|(?<![\w/])shared/(?:data|notes|paper|design)|/work/shared")
USER_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
              *sorted(p for p in (ROOT / "src" / "tailsieve").rglob("*") if p.suffix in (".py", ".md", ".json")),
              *sorted((ROOT / "examples").rglob("*.py"))]
CURVES = [[], *([name] for name in builtin_curves())]


@pytest.mark.parametrize("path", USER_FILES, ids=[str(p.relative_to(ROOT)) for p in USER_FILES])
def test_no_file_a_user_reads_points_into_the_shared_folder(path: Path) -> None:
    hits = [f"{n}: {line.strip()[:100]}" for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if SHARED.search(line)]
    assert not hits, hits


@pytest.mark.parametrize("text", ["../shared/design.md", "via shared/data/throughput/x.csv", "(shared/notes/a.md)",
                                  "/work/shared/paper/p.txt"])
def test_the_shared_pattern_finds_each_form(text: str) -> None:
    assert SHARED.search(text)
    assert not SHARED.search("shared_prefix, the shared pool, prompts/shared/x")


@pytest.mark.parametrize("argv", CURVES, ids=["listing", *builtin_curves()])
def test_curves_output_fits_120_columns_and_names_no_shared_path(argv: list[str],
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["curves", *argv]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 120
    assert not SHARED.search(out)
    if argv:  # the derivation and source are all there, wrapped
        c = builtin_curves()[argv[0]]
        assert " ".join(out.split()).count(" ".join(f"derivation: {c.derivation}".split())) == 1


def test_the_readme_cites_the_paper_with_a_link() -> None:
    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert ("[*TailSieve: Partial-Rollout-Guided Tail Routing for LLM Rollouts*](https://arxiv.org/abs/2608.22788), "
            "Xu et al., 2026") in text


@pytest.mark.parametrize(("argv", "line"), [
    (["simulate", "--replicas", "1"],
     "tailsieve simulate: error: --replicas 1: 6 of the 14 policies of --policy all (the default) need at least 2 "
     "replicas (a tail and a bulk pool); give --replicas 2 or more, or choose with --policy among uniform, "
     "uniform-oracle, seer-oracle, april-partial, april-drop, verl-lif, rollpacker, openrlhf-group"),
    (["simulate", "--replicas", "1", "--policy", "all"],
     "tailsieve simulate: error: --replicas 1: 6 of the 14 policies of --policy all (the default) need at least 2 "
     "replicas (a tail and a bulk pool); give --replicas 2 or more, or choose with --policy among uniform, "
     "uniform-oracle, seer-oracle, april-partial, april-drop, verl-lif, rollpacker, openrlhf-group"),
    (["simulate", "--replicas", "1", "--policy", "uniform,tailsieve"],
     "tailsieve simulate: error: policy tailsieve needs at least 2 replicas (a tail and a bulk pool), got R=1"),
    (["plan", "--replicas", "1"],
     "tailsieve plan: error: --replicas 1: plan weighs a tail pool against the bulk, which needs at least 2 replicas "
     "(a tail and a bulk pool)"),
])
def test_an_error_names_only_what_the_user_asked_for(argv: list[str], line: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*argv, "--steps", "3"]) == 1
    assert capsys.readouterr().err == line + "\n"
    named = {"streamrl-oracle", "topq-best", "tailsieve-paper", "static"} - set(" ".join(argv).split(","))
    assert not any(f"policy {n} " in line for n in named)


def test_one_replica_still_runs_what_runs_on_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--replicas", "1", "--policy", "uniform,verl-lif", "--steps", "3", "--groups", "4",
                 "--json"]) == 0
    assert capsys.readouterr().err == ""


def test_the_default_plot_is_readable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Every policy of `--plot --plot-policies all` (14) has its own colour, line style and marker, and no legend
    covers an axis label or tick label (the q/m panel's twin axis holds the right side, so its legend sits below)."""
    import tailsieve.cli.simulate_cmd as simulate_cmd

    figures: list[object] = []
    monkeypatch.setattr(simulate_cmd, "save_figure", lambda fig, path, **kw: figures.append(fig))  # kept open
    argv = ["simulate", "--steps", "3", "--groups", "8", "--replicas", "4", "--plot", str(tmp_path / "p.png"),
            "--plot-policies", "all"]  # the default draws 3 (tests/test_plot_policies.py); all 14 on request
    assert main(argv) == 0
    capsys.readouterr()
    fig = figures[0]
    fig.canvas.draw()  # type: ignore[attr-defined]
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    axes = fig.axes  # type: ignore[attr-defined]
    lines = axes[0].get_lines()
    assert len(lines) == 14
    assert len({(ln.get_color(), ln.get_linestyle(), ln.get_marker()) for ln in lines}) == 14
    assert len({ln.get_color() for ln in lines}) >= 13  # one colour repeats at most, with another marker
    legends = [ax.get_legend().get_window_extent(renderer) for ax in axes if ax.get_legend() is not None]
    assert len(legends) == 2
    texts = [t for ax in axes for t in (ax.xaxis.label, ax.yaxis.label, *ax.get_xticklabels(), *ax.get_yticklabels())
             if t.get_text()]
    covered = [t.get_text() for t in texts for box in legends if box.overlaps(t.get_window_extent(renderer))]
    import matplotlib.pyplot as plt

    plt.close(fig)  # type: ignore[arg-type]
    assert not covered, covered


def render_allow_list() -> str:
    """`ALLOWED` as docs/architecture.md prints it: one room a line, the five base modules as `base`."""
    from test_layers import ALLOWED, BASE

    out = []
    for part, allowed in ALLOWED.items():
        names = ["base", *(n for n in allowed if n not in BASE)] if set(BASE) <= set(allowed) else list(allowed)
        out.append(textwrap.fill(", ".join(names), 120, initial_indent=f"{part:<20} ", subsequent_indent=" " * 21))
    return "\n".join(out)


def test_architecture_md_prints_the_allow_list_the_layout_test_checks() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert f"```text\n{render_allow_list()}\n```" in text


def test_architecture_md_describes_adapters_as_packages() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    frameworks = sorted(p.name for p in (ROOT / "src" / "tailsieve" / "integrations").iterdir()
                        if p.is_dir() and p.name != "__pycache__")
    assert frameworks == ["slime", "trl", "verl"]
    assert all((ROOT / "src" / "tailsieve" / "integrations" / f / "session.py").is_file() for f in frameworks)
    assert "integrations/<framework>.py" not in text and "a package `src/tailsieve/integrations/<framework>/`" in text
