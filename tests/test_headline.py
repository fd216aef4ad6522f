"""The short first table of `simulate` and `plan` (analysis/headline.py): which rows decide, each row's fidelity
price, the 120-column fit, and `--policy all` for the full table."""

from __future__ import annotations

import json

import pytest

from tailsieve.analysis.fidelity import BatchFidelity, Standing, Verdict
from tailsieve.analysis.headline import HEADLINE_NOTE, headline_rows, price
from tailsieve.analysis.metrics import LengthBias, PolicySummary
from tailsieve.cli import main
from tailsieve.simulation.runs import PEERS, policy_names

SMALL = ["--groups", "8", "--group-size", "4", "--replicas", "4", "--steps", "5"]


def summary(name: str, speedup: float | None = 1.0, *, batch: BatchFidelity | None = None, ratio: float = 1.0,
            oracle: bool = False, noise: bool = False) -> PolicySummary:
    x, band = 1.0 if speedup is None else speedup, 10.0 if noise else 0.05  # noise: a band wider than any speedup
    standing = Standing.WITHIN_NOISE if abs(x - 1) <= band else Standing.PAYS if x > 1 else Standing.SLOWER
    verdict = Verdict(name, "uniform", standing, x, speedup_2sigma=band, paired_steps=10, note="n")
    return PolicySummary(policy=name, mean_step_s=10.0, speedup=speedup, final_q=0, final_m=0, wasted_share=0.0,
                         bias=LengthBias(ratio, 0.0, 10, 10), step_s_std=0.0, step_s_min=10.0, step_s_max=10.0,
                         oracle=oracle, verdict=verdict, batch=batch)


def test_price_names_what_a_policy_gives_up() -> None:
    assert price(summary("x")) == "none"
    assert price(summary("x", oracle=True)) == "knows lengths (not realizable)"
    b = BatchFidelity(off_policy_token_share=0.221, dropped_prompt_share=0.0, delayed_prompt_share=0.008,
                      batch_length_cv=0.2)
    assert price(summary("x", batch=b)) == "22.1% off-policy tokens, 0.8% delayed"
    drop = BatchFidelity(0.0, 0.099, 0.0004, 0.3)  # 0.04% delayed rounds to nothing and is left out
    assert price(summary("x", batch=drop, ratio=0.826)) == "9.9% dropped, lengths ×0.826"
    assert price(summary("x", ratio=0.995)) == "none"  # within 1% of uniform's lengths


def test_rows_are_the_deciding_ones_in_order() -> None:
    s = {n: summary(n, v) for n, v in [("uniform", 1.0), ("topq-best", 1.2), ("tailsieve", 1.03),
                                       ("april-partial", 1.6), ("april-drop", 1.7), ("verl-lif", 1.9),
                                       ("rollpacker", 1.5)]}
    assert headline_rows(s, PEERS) == [
        ("uniform", "reference"), ("verl-lif", "verl's balancer"), ("tailsieve", "TailSieve"),
        ("topq-best", "top-q, known lengths"),
        ("april-drop", "fastest: slime APRIL")]  # verl-lif is its own row
    rows = headline_rows({"uniform": s["uniform"], "static q=2 m=1": summary("static q=2 m=1")}, PEERS,
                         bound="static q=2 m=1")
    assert rows == [("uniform", "reference"), ("static q=2 m=1", "best static split")]


def test_default_simulate_prints_the_short_table_within_120_columns(capsys: pytest.CaptureFixture[str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)  # a pipe: 120 columns, not rich's 80
    assert main(["simulate", *SMALL]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 120
    body = [line.split("│")[1].strip() for line in lines if line.startswith("│") and line.split("│")[1].strip()]
    assert main(["simulate", *SMALL, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["policies"]
    peer = max((n for n in PEERS if n != "verl-lif"), key=lambda n: doc[n]["speedup"])
    assert body == ["uniform", "verl-lif", "tailsieve", "topq-best*", peer]  # the rows in order (a price may wrap)
    assert " ".join(out.split()).count(" ".join(HEADLINE_NOTE.split())) == 1
    assert "Partial-rollout tail capture" not in out and "static" not in body


def test_policy_all_prints_every_policy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *SMALL, "--policy", "all"]) == 0
    out = capsys.readouterr().out
    rows = [line.split()[0].rstrip("*") for line in out.splitlines() if line.strip()]
    assert [r for r in rows if r in policy_names()] == list(policy_names())  # one line each, in order
    assert max(len(line) for line in out.splitlines()) <= 120
    assert "Partial-rollout tail capture" in out and HEADLINE_NOTE[:40] not in out
