"""The short table `simulate` and `plan` print first: the few rows that answer "does it beat what I run?".

Rows, in order, each only when it ran: `uniform` (the reference), `verl-lif` (verl's request balancer: what a verl
user runs today), `tailsieve` (this package's controller), the best static split (`plan`) or the known-length top-q
heuristic (`topq-best`, `simulate`: the best top-(q, m) split of uniform's own batches in hindsight, with no
over-provisioning and no redraws; a heuristic, not a bound: tailsieve can beat it), and the fastest other peer with
its fidelity price (what it gives up for its speed: off-policy tokens, dropped or delayed prompts, a length bias
against uniform). `--policy all` prints every policy with the full columns instead
(`analysis.report.summary_table`). """

from __future__ import annotations

from collections.abc import Collection, Mapping

from rich.table import Table

from tailsieve.analysis.metrics import PolicySummary
from tailsieve.analysis.report import band

__all__ = ["HEADLINE_COLUMNS", "HEADLINE_NOTE", "headline_rows", "headline_table", "price"]

HEADLINE_COLUMNS = ("policy", "what it is", "step s", "speedup", "±2σ", "fidelity price")
HEADLINE_NOTE = ("speedup = uniform's mean step time / the policy's on the same prompts and length draws (steps "
                 "after warm-up), ±2σ its noise band (~: within noise of uniform), fidelity price = what the policy "
                 "gives up for it (off-policy tokens, dropped or delayed prompts, batch lengths vs uniform's).")
PEER_ROLES = {"april-partial": "slime APRIL", "april-drop": "slime APRIL", "rollpacker": "RollPacker",
              "openrlhf-group": "OpenRLHF"}  # docs/peers.md
TOPQ_ROLE = "known-length top-q heuristic"  # not a bound: no over-provisioning (docs/baselines.md, `topq-best`)
BIAS_SHOWN = 0.01  # a length ratio this far from 1 is part of the price


def price(s: PolicySummary) -> str:
    """What a policy gives up for its speed: off-policy tokens, dropped / delayed prompts, length bias ("none")."""
    if s.oracle:
        return "knows the lengths (not realizable)"
    parts = []
    if s.batch is not None:
        for share, what in ((s.batch.off_policy_token_share, "off-policy tokens"),
                            (s.batch.dropped_prompt_share, "dropped"), (s.batch.delayed_prompt_share, "delayed")):
            if share >= 0.0005:
                parts.append(f"{100 * share:.1f}% {what}")
    if s.bias is not None and abs(s.bias.mean_ratio - 1) >= BIAS_SHOWN:
        parts.append(f"lengths ×{s.bias.mean_ratio:.3f}")
    return ", ".join(parts) or "none"


def headline_rows(summaries: Mapping[str, PolicySummary], peers: Collection[str], *,
                  bound: str | None = "topq-best") -> list[tuple[str, str]]:
    """(policy, what it is) of the deciding rows that ran: uniform, verl-lif, tailsieve, `bound`, the fastest peer
    other than verl-lif (ties: the first in `summaries` order)."""
    wanted = [("uniform", "the reference"), ("verl-lif", "verl's request balancer"), ("tailsieve", "TailSieve")]
    if bound is not None:
        wanted.append((bound, "best static split" if bound.startswith("static") else TOPQ_ROLE))
    rows = [(name, role) for name, role in wanted if name in summaries]
    others = [n for n in summaries if n in peers and n != "verl-lif" and summaries[n].speedup is not None]
    if others:
        best = max(others, key=lambda n: summaries[n].speedup or 0.0)
        rows.append((best, f"fastest peer ({PEER_ROLES.get(best, best)})"))
    return rows


def headline_table(summaries: Mapping[str, PolicySummary], rows: list[tuple[str, str]], *, title: str) -> Table:
    """The short table of `rows` (`headline_rows`): text columns left-aligned, numbers right-aligned."""
    table = Table(title=title)
    for col in HEADLINE_COLUMNS:
        table.add_column(col, justify="right" if col in ("step s", "speedup", "±2σ") else "left")
    for name, role in rows:
        s = summaries[name]
        speedup = "-" if s.speedup is None else f"{s.speedup:.3f}×"
        table.add_row(f"{name}{'*' if s.oracle else ''}", role, f"{s.mean_step_s:.2f}", speedup, band(s.verdict),
                      price(s))
    return table
