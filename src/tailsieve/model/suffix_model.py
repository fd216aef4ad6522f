"""Suffix decoding from the rollout's own history (issue 52; docs/speculative.md, "Suffix decoding on the tail pool").

A suffix-tree drafter (vLLM's `suffix` method) proposes the continuation of the longest match of a request's recent
tokens in what it has cached. Its acceptance therefore depends on the **draft source**, what the replica holds that
resembles the request's own future (`DraftSource`): only its prompt and unrelated responses; siblings of the same group
running on the same replica; the previous step's cut partial responses of the same group; earlier epochs' responses
to the same prompt. Per source and bracket (low, central, high) `source_draft` gives a per-position acceptance α and
a draft share p (share of iterations that carry a draft), from the published points in `data/suffix_measurements.json`
(the minimum, median and maximum of each source's points: the brackets contain every point; where a source has no
point of its own the stand-in is named in `SourceDraft.derivation`).

A pool's configuration (`pool_spec`) takes, per request, the best source available to it (the drafter keeps the
higher-scoring of its trees), mixes requests with and without a co-located sibling by the share the dispatch gives
(`colocated_share`), and matches the mixture's ā and verified tokens exactly at the pool's depth with one (α, p).
Costs: verification as the calibrated MTP profile of the same family and bracket (the target model verifying d tokens
costs the same whoever drafted them), the speculative path's fixed overhead from the published K = 0 point, and the
suffix tree's CPU time per running request per iteration (`draft_cpu_s`, measured on vLLM's implementation:
bench/bench_suffix_cpu.py).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from importlib import resources
from typing import Any

from tailsieve.errors import ConfigError
from tailsieve.model.spec_calibration import profile
from tailsieve.model.spec_records import Bracket, Family
from tailsieve.model.speculative import MAX_TOKENS, SpecConfig, SpecMethod

REF_DEPTH = 8  # depth at which the siblings' central stand-in is placed between its neighbours (ā at d = 8)
DEFAULT_DEPTHS = (2, 4, 8)  # the comparison's depths: suffix drafts adaptively up to num_speculative_tokens


class DraftSource(StrEnum):
    """Where a suffix drafter's matches come from."""

    PROMPT = "prompt"  # the request's own prompt and output, and unrelated cached responses (always available)
    SIBLINGS = "siblings"  # other samples of the same group running on the same replica
    CUT = "cut"  # the previous step's cut partial responses of the same group (TailSieve's tail pool)
    EPOCHS = "epochs"  # earlier epochs' responses to the same prompt


@dataclass(frozen=True, slots=True)
class SuffixPoint:
    """One published number (`data/suffix_measurements.json`)."""

    id: str
    draft_source: DraftSource
    metric: str
    use: str
    concurrency: int | None
    depth: int | None
    value: float
    tolerance: float
    source: str
    hardware: str
    engine: str
    model: str
    task: str
    note: str


@lru_cache(maxsize=1)
def suffix_points() -> tuple[SuffixPoint, ...]:
    """Every shipped suffix measurement, in file order."""
    text = resources.files("tailsieve").joinpath("data/suffix_measurements.json").read_text(encoding="utf-8")
    raw: list[dict[str, Any]] = json.loads(text)["measurements"]
    return tuple(SuffixPoint(**(r | {"draft_source": DraftSource(r["draft_source"])})) for r in raw)


def _values(source: DraftSource, metric: str, use: str = "bracket") -> list[float]:
    return sorted(p.value for p in suffix_points() if p.draft_source is source and p.metric == metric and p.use == use)


def _pick(values: list[float], bracket: Bracket) -> float:
    if not values:
        raise ConfigError("no published suffix point for this source (data/suffix_measurements.json)")
    picks = {Bracket.LOW: values[0], Bracket.CENTRAL: statistics.median(values), Bracket.HIGH: values[-1]}
    return float(picks[bracket])


@dataclass(frozen=True, slots=True)
class SourceDraft:
    """One source's drafts under one bracket: per-position acceptance α (γ = 1) and draft share p."""

    source: DraftSource
    bracket: Bracket
    acceptance: float
    draft_share: float
    derivation: str

    def expected_tokens(self, depth: int) -> float:
        """ā at depth d: 1 + p·Σ_{k=1..d} α^k."""
        return 1.0 + self.draft_share * sum(self.acceptance**k for k in range(1, depth + 1))


def alpha_for_share(expected: float, share: float, depth: int) -> float:
    """α such that 1 + p·Σ_{k=1..d} α^k = `expected` (bisection; increasing in α)."""
    if depth == 0 or share == 0.0:
        return 0.0
    top = 1.0 + share * depth
    if not 1.0 <= expected <= top + 1e-12:
        raise ConfigError(f"expected tokens {expected:g} outside 1..{top:g} for depth {depth}, draft share {share:g}")
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if 1.0 + share * sum(mid**k for k in range(1, depth + 1)) < expected:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@lru_cache(maxsize=32)
def source_draft(source: DraftSource, bracket: Bracket) -> SourceDraft:
    """The bracket's α and p for one draft source (module docstring)."""
    if source is DraftSource.PROMPT:
        return SourceDraft(source, bracket, _pick(_values(source, "acceptance"), bracket),
                           _pick(_values(source, "draft_share"), bracket),
                           "min/median/max of the published suffix acceptances and draft shares without history")
    if source in (DraftSource.EPOCHS, DraftSource.CUT):
        alpha = _pick(_values(DraftSource.EPOCHS, "accept_share"), bracket)  # the geometric model's α at d → ∞
        how = "min/median/max of the published cross-epoch overlap (share of tokens a draft supplies)"
        if source is DraftSource.CUT:
            how += ("; stand-in: a cut partial response comes from the same prompt one step of policy drift earlier, "
                    "an epoch's response from one epoch earlier, so the epoch range is taken as the cut work's")
        return SourceDraft(source, bracket, alpha, 1.0, how)
    low, mid = source_draft(DraftSource.PROMPT, Bracket.LOW), source_draft(DraftSource.PROMPT, Bracket.CENTRAL)
    epoch = source_draft(DraftSource.EPOCHS, bracket)
    if bracket is Bracket.LOW:
        return SourceDraft(source, bracket, low.acceptance, low.draft_share,
                           "assumption: siblings add nothing over the prompt (no per-source point could be read)")
    if bracket is Bracket.HIGH:
        return SourceDraft(source, bracket, epoch.acceptance, 1.0,
                           "assumption: siblings draft as well as earlier epochs' responses (the epoch high)")
    expected = (mid.expected_tokens(REF_DEPTH) + epoch.expected_tokens(REF_DEPTH)) / 2
    return SourceDraft(source, bracket, alpha_for_share(expected, 1.0, REF_DEPTH), 1.0,
                       f"assumption: ā at d = {REF_DEPTH} halfway between the prompt's and the epochs' central "
                       "profiles")


def colocated_share(group_size: int, replicas: int, by_request: bool) -> float:
    """Share of a group's members that run beside at least one sibling: 1 when groups are dispatched whole (or one
    replica), else round-robin gives replica i ⌊G/R⌋ or ⌈G/R⌉ members and only those with two or more count."""
    if group_size < 2 or replicas < 1:
        return 0.0
    if not by_request or replicas == 1:
        return 1.0
    counts = [group_size // replicas + (1 if i < group_size % replicas else 0) for i in range(replicas)]
    return sum(c for c in counts if c >= 2) / group_size


@dataclass(frozen=True, slots=True)
class PoolSources:
    """What a pool's drafter can match against: its sources and the share of requests with a co-located sibling."""

    sources: frozenset[DraftSource]
    sibling_share: float = 0.0

    @classmethod
    def of(cls, sources: Iterable[DraftSource], sibling_share: float = 0.0) -> PoolSources:
        """The prompt is always a source."""
        return cls(frozenset((*sources, DraftSource.PROMPT)), sibling_share)

    @property
    def label(self) -> str:
        """`cut+prompt`, `siblings(25%)+prompt`, …"""
        names = [s.value if s is not DraftSource.SIBLINGS else f"siblings({100 * self.sibling_share:.0f}%)"
                 for s in DraftSource if s in self.sources]
        return "+".join(names)


def _best(sources: Iterable[DraftSource], bracket: Bracket, depth: int) -> SourceDraft:
    return max((source_draft(s, bracket) for s in sources), key=lambda x: (x.expected_tokens(depth), x.source.value))


def overhead() -> float:
    """c: the speculative path's fixed per-iteration cost with nothing drafted, as a share of a plain step."""
    return _pick(_values(DraftSource.PROMPT, "overhead", "cost"), Bracket.CENTRAL)


def cpu_seconds() -> float:
    """t: CPU seconds per running request per iteration of vLLM's suffix proposer (the measured point)."""
    return _pick(_values(DraftSource.PROMPT, "cpu_s", "cost"), Bracket.CENTRAL)


def pool_spec(pool: PoolSources, bracket: Bracket, depth: int, family: Family = Family.DENSE) -> SpecConfig:
    """One pool's suffix configuration at depth d (module docstring): ā and 1 + p·d match the pool's mixture of
    requests with and without a co-located sibling exactly."""
    if not 0 <= depth <= MAX_TOKENS:
        raise ConfigError(f"suffix depth must be in 0..{MAX_TOKENS}, got {depth}")
    if depth == 0:
        return SpecConfig(SpecMethod.NONE)
    without = _best(pool.sources - {DraftSource.SIBLINGS}, bracket, depth)
    w = pool.sibling_share if DraftSource.SIBLINGS in pool.sources else 0.0
    with_sib = _best(pool.sources, bracket, depth) if w > 0 else without
    share = w * with_sib.draft_share + (1 - w) * without.draft_share
    expected = w * with_sib.expected_tokens(depth) + (1 - w) * without.expected_tokens(depth)
    alpha = alpha_for_share(min(expected, 1.0 + share * depth), share, depth)
    cost = profile(SpecMethod.MTP, family, bracket).spec
    return SpecConfig(SpecMethod.SUFFIX, tokens=depth, acceptance=alpha, decay=1.0, draft_cost=overhead(),
                      verify_cost=cost.verify, draft_share=share, token_cost=cost.token_cost,
                      token_cost_slope=cost.token_cost_slope, draft_cpu_s=cpu_seconds())


def source_table(depths: tuple[int, ...] = (1, 2, 4, 8, 16)) -> list[dict[str, Any]]:
    """Every source and bracket: α, p, ā at each depth and where they come from (for `curves --spec`, the docs)."""
    return [{"source": s.value, "bracket": b.value, "acceptance": d.acceptance, "draft_share": d.draft_share,
             "expected_tokens": {str(k): d.expected_tokens(k) for k in depths}, "derivation": d.derivation}
            for s in DraftSource for b in Bracket for d in (source_draft(s, b),)]
