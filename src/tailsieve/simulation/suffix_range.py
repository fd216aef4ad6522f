"""Suffix decoding across the published range (`simulate --spec suffix`, `plan --spec suffix`; docs/speculative.md):
verl's balancer without speculation against uniform + suffix on every replica, TailSieve with suffix on the tail pool
only and TailSieve with suffix everywhere, each at its best depth under the low, central and high brackets, on one
prompt stream; and which conclusions hold across the range.

Draft sources per arm (`model/suffix_model.py`): uniform routing and TailSieve's bulk pool run fresh groups, so their
drafters see the prompt and, for the share of requests the dispatch puts beside a sibling, the siblings; TailSieve's
tail pool regenerates last step's cut groups, whose partial responses are its drafts (simulated: a real replica gets
them only when it ran the cut group itself, docs/speculative.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from tailsieve.model.curves import TpotCurve
from tailsieve.model.spec_records import Bracket, Family
from tailsieve.model.speculative import MAX_TOKENS, PoolSpec, SpecConfig, SpecMethod
from tailsieve.model.suffix_model import DEFAULT_DEPTHS, DraftSource, PoolSources, colocated_share, pool_spec
from tailsieve.policy.router import Dispatch
from tailsieve.simulation.runs import PolicyRun, SimConfig, run_policy
from tailsieve.workloads import Workload

BALANCER = "verl-lif"
TAIL_TARGET, UNIFORM_TARGET = 1.5, 1.10  # issue 52's targets: ≥ 1.5× verl-lif, ≥ 1.10× uniform + suffix everywhere
ROUTE_WIN = 0.01

OnStep = Callable[[str, int], None]

# The ideal tail drafter: every drafted token accepted, at the largest depth, drafting and verifying for free, so the
# tail pool decodes d + 1 tokens per iteration at τ(b). No drafter on the tail pool alone can do better.
IDEAL_TAIL = SpecConfig(method=SpecMethod.SUFFIX, tokens=MAX_TOKENS, acceptance=1.0, decay=1.0, draft_cost=0.0,
                        verify_cost=0.0, draft_share=1.0)


@dataclass(frozen=True, slots=True)
class SuffixArm:
    """One arm at its best depth: mean step seconds, speedup over verl-lif without speculation, pools' sources."""

    name: str
    depth: int
    mean_step_s: float
    speedup: float
    sources: str


@dataclass(frozen=True, slots=True)
class SuffixRow:
    """One bracket's arms (best depth each); `no_spec` is TailSieve without speculation."""

    bracket: Bracket
    no_spec: float
    uniform: SuffixArm  # the faster of verl-lif + suffix and group-routed uniform + suffix, every replica
    tail_only: SuffixArm
    everywhere: SuffixArm

    @property
    def vs_uniform(self) -> float:
        """TailSieve tail-only over uniform + suffix everywhere (step time ratio)."""
        return self.uniform.mean_step_s / self.tail_only.mean_step_s


@dataclass(frozen=True, slots=True)
class SuffixTable:
    """Every bracket's row, on one stream; `reference_s` is verl-lif without speculation."""

    policy: str
    reference_s: float
    depths: tuple[int, ...]
    rows: tuple[SuffixRow, ...]


def arm_sources(config: SimConfig) -> dict[str, tuple[PoolSources, PoolSources]]:
    """(tail, bulk) draft sources per arm: siblings by the dispatch's co-location share, the cut work on the tail."""
    r, g = config.router.replicas, config.router.group_size
    by_request = config.router.dispatch is Dispatch.REQUEST
    lif = PoolSources.of([DraftSource.SIBLINGS], colocated_share(g, r, True))
    grouped = PoolSources.of([DraftSource.SIBLINGS], colocated_share(g, r, False))
    bulk = PoolSources.of([DraftSource.SIBLINGS], colocated_share(g, max(r - 1, 1), by_request))
    tail = PoolSources.of([DraftSource.CUT])
    return {"verl-lif": (lif, lif), "uniform": (grouped, grouped), "tail": (tail, PoolSources.of([])),
            "everywhere": (tail, bulk)}


def suffix_compare(workload: Workload, curve: TpotCurve, config: SimConfig, *, policy: str = "tailsieve",
                   depths: Sequence[int] = DEFAULT_DEPTHS, brackets: Sequence[Bracket] = tuple(Bracket),
                   family: Family = Family.DENSE, on_step: OnStep | None = None) -> SuffixTable:
    """Run every arm at every depth under every bracket on the same stream (module docstring)."""
    sources = arm_sources(config)

    def run(name: str, pools: PoolSpec, label: str) -> float:
        tick = None if on_step is None else (lambda _n, i: on_step(label, i))
        return run_policy(name, workload, curve, replace(config, spec=pools), on_step=tick).mean_step_s()

    def spec(which: str, pool: int, bracket: Bracket, d: int) -> SpecConfig:
        return pool_spec(sources[which][pool], bracket, d, family)

    reference = run(BALANCER, PoolSpec(), f"{BALANCER} no spec")
    no_spec = run(policy, PoolSpec(), f"{policy} no spec")
    rows = []
    for b in brackets:
        arms: dict[str, list[SuffixArm]] = {"uniform": [], "tail": [], "everywhere": []}
        for d in depths:
            for name, which in ((BALANCER, "verl-lif"), ("uniform", "uniform")):
                s = spec(which, 1, b, d)
                t = run(name, PoolSpec.uniform(s), f"{name} suffix {b.value} d={d}")
                arms["uniform"].append(SuffixArm(f"{name} + suffix", d, t, reference / t, sources[which][1].label))
            t = run(policy, PoolSpec(tail=spec("tail", 0, b, d)), f"{policy} tail {b.value} d={d}")
            arms["tail"].append(SuffixArm(f"{policy}, tail-pool suffix", d, t, reference / t,
                                          f"tail {sources['tail'][0].label}"))
            t = run(policy, PoolSpec(tail=spec("everywhere", 0, b, d), bulk=spec("everywhere", 1, b, d)),
                    f"{policy} everywhere {b.value} d={d}")
            arms["everywhere"].append(SuffixArm(f"{policy}, suffix everywhere", d, t, reference / t,
                                                f"tail {sources['everywhere'][0].label}; bulk "
                                                f"{sources['everywhere'][1].label}"))
        best = {k: min(v, key=lambda a: (a.mean_step_s, a.depth)) for k, v in arms.items()}
        rows.append(SuffixRow(b, reference / no_spec, best["uniform"], best["tail"], best["everywhere"]))
    return SuffixTable(policy, reference, tuple(depths), tuple(rows))


@dataclass(frozen=True, slots=True)
class Ceiling:
    """The most a tail-pool drafter can give: the best split with the ideal drafter (`IDEAL_TAIL`) on the tail pool."""

    speedup: float  # over verl-lif without speculation
    policy: str  # the controller's name, or `static q=Q m=M`
    q: int | None
    m: int | None


def static_grid(config: SimConfig) -> list[tuple[int, int]]:
    """(q, m) of the ceiling's static splits: q ∈ {E, ⌈E/2⌉, ⌈E/4⌉} at every m in 1..⌊R/2⌋ (E = ⌈ρN⌉, §2.2)."""
    e = max(config.router.extra, 1)
    qs = sorted({e, -(-e // 2), -(-e // 4)}, reverse=True)
    return [(q, m) for m in range(1, max(config.router.replicas // 2, 1) + 1) for q in qs]


def ceiling_runs(workload: Workload, curve: TpotCurve, config: SimConfig, *, policy: str = "tailsieve",
                 on_step: OnStep | None = None) -> Iterator[tuple[str, int | None, int | None, PolicyRun]]:
    """Every run the ceiling weighs, as (label, q, m, run): `policy`, then each split of `static_grid`, all with
    `IDEAL_TAIL` on the tail pool (lazily: one run at a time)."""
    def run(name: str, cfg: SimConfig, label: str) -> PolicyRun:
        tick = None if on_step is None else (lambda _n, i: on_step(label, i))
        return run_policy(name, workload, curve, cfg, on_step=tick)

    ideal = replace(config, spec=PoolSpec(tail=IDEAL_TAIL))
    yield policy, None, None, run(policy, ideal, f"{policy} ideal tail")
    for q, m in static_grid(config):
        yield f"static q={q} m={m}", q, m, run("static", replace(ideal, q=q, m=m), f"static q={q} m={m} ideal tail")


def tail_ceiling(workload: Workload, curve: TpotCurve, config: SimConfig, *, policy: str = "tailsieve",
                 reference_s: float | None = None, on_step: OnStep | None = None) -> Ceiling:
    """Upper bound of tail-pool speculation: the fastest of `ceiling_runs` (ties: the earlier)."""
    if reference_s is None:
        tick = None if on_step is None else (lambda _n, i: on_step(f"{BALANCER} no spec", i))
        reference_s = run_policy(BALANCER, workload, curve, config, on_step=tick).mean_step_s()
    best: Ceiling | None = None
    for label, q, m, r in ceiling_runs(workload, curve, config, policy=policy, on_step=on_step):
        speedup = reference_s / r.mean_step_s()
        if best is None or speedup > best.speedup:
            best = Ceiling(speedup, label, q, m)
    assert best is not None
    return best


Test = Callable[[SuffixRow], bool]
CONCLUSIONS: tuple[tuple[str, Test], ...] = (
    ("suffix pays under uniform routing (uniform + suffix beats verl-lif without it)", lambda r: r.uniform.speedup > 1),
    ("TailSieve with tail-pool suffix beats uniform + suffix everywhere", lambda r: r.vs_uniform > 1),
    (f"TailSieve with tail-pool suffix ≥ {TAIL_TARGET:g}× verl-lif", lambda r: r.tail_only.speedup >= TAIL_TARGET),
    (f"TailSieve with tail-pool suffix ≥ {UNIFORM_TARGET:g}× uniform + suffix everywhere",
     lambda r: r.vs_uniform >= UNIFORM_TARGET),
    ("tail-pool suffix adds to TailSieve (beats TailSieve without speculation)",
     lambda r: r.tail_only.speedup > r.no_spec),
    (f"suffix on the bulk pool too beats tail-pool suffix by more than {100 * ROUTE_WIN:g}%",
     lambda r: r.everywhere.speedup > r.tail_only.speedup * (1 + ROUTE_WIN)),
)


def verdict_lines(rows: Sequence[SuffixRow]) -> list[str]:
    """`holds (yes|no under every bracket)` or `flips (low …, central …, high …)` per conclusion."""
    out = []
    for text, test in CONCLUSIONS:
        values = [test(r) for r in rows]
        if len(set(values)) == 1:
            out.append(f"holds ({'yes' if values[0] else 'no'} under every bracket): {text}")
        else:
            where = ", ".join(f"{r.bracket.value} {'yes' if v else 'no'}" for r, v in zip(rows, values, strict=True))
            out.append(f"flips ({where}): {text}")
    return out


def table_json(table: SuffixTable) -> dict[str, object]:
    """The table and verdicts as JSON."""
    def arm(a: SuffixArm) -> dict[str, object]:
        return {"name": a.name, "depth": a.depth, "mean_step_s": a.mean_step_s, "speedup": a.speedup,
                "sources": a.sources}

    return {"policy": table.policy, "reference": BALANCER, "reference_s": table.reference_s,
            "depths": list(table.depths),
            "brackets": [{"bracket": r.bracket.value, "tailsieve_no_spec": r.no_spec, "uniform_suffix": arm(r.uniform),
                          "tail_only": arm(r.tail_only), "everywhere": arm(r.everywhere),
                          "tail_only_vs_uniform_suffix": r.vs_uniform} for r in table.rows],
            "verdicts": verdict_lines(table.rows)}


def table_lines(table: SuffixTable) -> list[str]:
    """A markdown table: speedups over verl-lif without speculation, best depth in brackets."""
    out = [f"| bracket | {table.policy}, no spec | uniform + suffix everywhere | {table.policy}, tail-pool suffix | "
           f"{table.policy}, suffix everywhere | tail-pool / uniform + suffix |", "|---|---|---|---|---|---|"]
    for r in table.rows:
        u = r.uniform
        out.append(f"| {r.bracket.value} | {r.no_spec:.3f}× | {u.speedup:.3f}× ({u.name.split(' +')[0]}, d={u.depth}) "
                   f"| {r.tail_only.speedup:.3f}× (d={r.tail_only.depth}) | {r.everywhere.speedup:.3f}× "
                   f"(d={r.everywhere.depth}) | {r.vs_uniform:.3f}× |")
    return out


def nan_free(table: SuffixTable) -> bool:
    """True when every speedup is a number (a run with no measured step gives NaN)."""
    return all(not math.isnan(a.speedup) for r in table.rows for a in (r.uniform, r.tail_only, r.everywhere))
