"""`simulate --spec suffix` and `plan --spec suffix`: model-free speculation from the rollout's own history, four arms
under the low, central and high brackets on one stream (`simulation/suffix_range.py`; docs/speculative.md)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from tailsieve.cli._common import progress_enabled
from tailsieve.cli.sim_args import progress_bar
from tailsieve.errors import ConfigError
from tailsieve.model.curves import TpotCurve
from tailsieve.model.spec_records import Bracket, family_of
from tailsieve.model.suffix_model import DEFAULT_DEPTHS
from tailsieve.simulation.runs import SimConfig
from tailsieve.simulation.suffix_range import BALANCER, suffix_compare, table_json
from tailsieve.workloads import Workload


def suffix_brackets(text: str | None) -> tuple[Bracket, ...] | None:
    """`suffix` → every bracket, `suffix:low` → one; None for anything else (`suffix:default`, keys, other methods:
    the matched-budget table)."""
    if text is None:
        return None
    name, *parts = [p.strip().lower() for p in text.split(":")]
    if name != "suffix" or "," in text:
        return None
    if not parts:
        return tuple(Bracket)
    if len(parts) == 1 and parts[0] in {b.value for b in Bracket}:
        return (Bracket(parts[0]),)
    if len(parts) == 1 and parts[0] == "default":
        return None
    raise ConfigError(f"--spec suffix takes :low, :central, :high or :default, got {text!r} (the depths are swept: "
                      f"--spec-budgets for simulate, --spec-depths for plan)")


def run_suffix(workload: Workload, curve: TpotCurve, config: SimConfig, policy: str, brackets: tuple[Bracket, ...],
               depths: tuple[int, ...] | None) -> dict[str, Any]:
    """Run the comparison; JSON-ready."""
    chosen = tuple(d for d in (depths or DEFAULT_DEPTHS) if d > 0)
    if not chosen:
        raise ConfigError("--spec suffix needs a depth above 0 to try")
    total = config.steps * (2 + 4 * len(chosen) * len(brackets))
    with progress_bar(total, enabled=progress_enabled()) as tick:
        table = suffix_compare(workload, curve, config, policy=policy, depths=chosen, brackets=brackets,
                               family=family_of(curve), on_step=tick)
    return {"suffix": table_json(table), "curve": curve.name, "workload": workload.name}


def print_suffix(con: Console, doc: dict[str, Any]) -> None:
    """The table of speedups over verl-lif without speculation, then the verdicts."""
    s = doc["suffix"]
    policy = s["policy"]
    table = Table(title=f"suffix decoding on {doc['workload']}, curve {doc['curve']}: speedup over {BALANCER} without "
                        "speculation (best depth of " + ",".join(str(d) for d in s["depths"]) + ")")
    for col in ("bracket", f"{policy}, no spec", "uniform + suffix everywhere", f"{policy}, tail-pool suffix",
                f"{policy}, suffix everywhere", "tail-pool / uniform+suffix"):
        table.add_column(col, justify="left" if col == "bracket" else "right")
    for r in s["brackets"]:
        u, t, e = r["uniform_suffix"], r["tail_only"], r["everywhere"]
        table.add_row(r["bracket"], f"{r['tailsieve_no_spec']:.3f}×",
                      f"{u['speedup']:.3f}× ({u['name'].split(' +')[0]}, d={u['depth']})",
                      f"{t['speedup']:.3f}× (d={t['depth']})", f"{e['speedup']:.3f}× (d={e['depth']})",
                      f"{r['tail_only_vs_uniform_suffix']:.3f}×")
    con.print(table)
    con.print("draft sources: tail pool = the cut groups' partial responses (simulated: vLLM's API cannot seed a "
              "replica that did not run them, docs/speculative.md); bulk and uniform = the prompt and co-located "
              "siblings by the dispatch's share", highlight=False)
    for line in s["verdicts"]:
        con.print(line, highlight=False)
