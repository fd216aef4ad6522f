"""The short table `simulate` and `plan` print first: the few rows that answer "does it beat what I run?".

Rows, in order, each only when it ran: `uniform` (the reference), `verl-lif` (verl's request balancer: what a verl
user runs today), `tailsieve` (this package's controller), the best static split (`plan`) or the known-length top-q
heuristic (`topq-best`, `simulate`: the best top-(q, m) split of uniform's own batches in hindsight, with no
over-provisioning and no redraws; a heuristic, not a bound: tailsieve can beat it), and the fastest other peer with
its fidelity price (what it gives up for its speed: off-policy tokens, dropped or delayed prompts, a length bias
against uniform). With verl's balancer in the run each row stands against it first (speedup and paired band),
uniform's column beside it as the reference. `--policy all` prints every policy with the full columns instead
(`analysis.report.summary_table`). """

from __future__ import annotations

from collections.abc import Collection, Mapping

from rich.table import Table

from tailsieve.analysis.balancer import BALANCER
from tailsieve.analysis.fidelity import paired_2sigma
from tailsieve.analysis.metrics import PolicySummary
from tailsieve.analysis.report import band
from tailsieve.loop import SKIP_STEPS, PolicyRun

__all__ = ["HEADLINE_COLUMNS", "HEADLINE_NOTE", "PLAIN_COLUMNS", "PLAIN_NOTE", "against", "headline_note",
           "headline_rows", "headline_table", "price"]

HEADLINE_COLUMNS = ("policy", "what it is", "step s", "vs verl-lif", "±2σ", "vs uniform", "fidelity price")
PLAIN_COLUMNS = ("policy", "what it is", "step s", "speedup", "±2σ", "fidelity price")  # verl-lif did not run
HEADLINE_NOTE = ("vs verl-lif = verl's balancer's mean step time / the policy's on the same prompts and length draws "
                 "(steps after warm-up), ±2σ its paired noise band in this run; vs uniform = the same against uniform "
                 "(the reference; ~: within noise of uniform); fidelity price = what the policy gives up for its "
                 "speed (off-policy tokens, dropped or delayed prompts, response lengths vs uniform's).")
PLAIN_NOTE = ("speedup = uniform's mean step time / the policy's on the same prompts and length draws (steps "
              "after warm-up), ±2σ its noise band (~: within noise of uniform), fidelity price = what the policy "
              "gives up for it (off-policy tokens, dropped or delayed prompts, batch lengths vs uniform's).")
PEER_ROLES = {"april-partial": "slime APRIL", "april-drop": "slime APRIL", "rollpacker": "RollPacker",
              "openrlhf-group": "OpenRLHF"}  # docs/peers.md
TOPQ_ROLE = "top-q, known lengths"  # not a bound: no over-provisioning (docs/baselines.md, `topq-best`)
BIAS_SHOWN = 0.01  # a length ratio this far from 1 is part of the price


def price(s: PolicySummary) -> str:
    """What a policy gives up for its speed: off-policy tokens, dropped / delayed prompts, length bias ("none")."""
    if s.oracle:
        return "knows lengths (not realizable)"
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
    wanted = [("uniform", "reference"), ("verl-lif", "verl's balancer"), ("tailsieve", "TailSieve")]
    if bound is not None:
        wanted.append((bound, "best static split" if bound.startswith("static") else TOPQ_ROLE))
    rows = [(name, role) for name, role in wanted if name in summaries]
    others = [n for n in summaries if n in peers and n != "verl-lif" and summaries[n].speedup is not None]
    if others:
        best = max(others, key=lambda n: summaries[n].speedup or 0.0)
        rows.append((best, f"fastest: {PEER_ROLES.get(best, best)}"))
    return rows


def headline_note(runs: Mapping[str, PolicyRun]) -> str:
    """The note under the table: `HEADLINE_NOTE` when verl's balancer ran (its columns first), else `PLAIN_NOTE`."""
    return HEADLINE_NOTE if BALANCER in runs else PLAIN_NOTE


def headline_table(summaries: Mapping[str, PolicySummary], rows: list[tuple[str, str]], *, title: str,
                   runs: Mapping[str, PolicyRun] | None = None) -> Table:
    """The short table of `rows` (`headline_rows`): with verl's balancer among `runs`, each row against it first
    (speedup and paired ±2σ band), then its speedup over uniform as the reference column; text columns left-aligned,
    numbers right-aligned."""
    lif = (runs or {}).get(BALANCER)
    table = Table(title=title)
    for col in HEADLINE_COLUMNS if lif is not None else PLAIN_COLUMNS:
        table.add_column(col, justify="left" if col in ("policy", "what it is", "fidelity price") else "right")
    for name, role in rows:
        s = summaries[name]
        speedup = "-" if s.speedup is None else f"{s.speedup:.3f}×"
        cells = [f"{name}{'*' if s.oracle else ''}", role, f"{s.mean_step_s:.2f}"]
        if lif is None or runs is None or name not in runs:
            cells += [speedup, band(s.verdict)]
        else:
            vs, pm = against(runs[name], lif)
            cells += [vs, pm, speedup + ("~" if s.verdict is not None and s.verdict.within_noise else "")]
        table.add_row(*cells, price(s))
    return table


def against(run: PolicyRun, lif: PolicyRun) -> tuple[str, str]:
    """The ("1.006×", "±2.1%") cells of `run` against verl's balancer ("-" for the balancer itself)."""
    if run is lif or run.policy == BALANCER:
        return "1.000×", "-"
    speedup = lif.mean_step_s(SKIP_STEPS) / run.mean_step_s(SKIP_STEPS)
    pm, _ = paired_2sigma(run, lif)
    return f"{speedup:.3f}×", "-" if pm is None else f"±{100 * pm:.1f}%"
