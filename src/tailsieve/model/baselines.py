"""Known-length group routing baselines over R identical replicas (App. A.2; top-(q, m) of §2.2 and §2.4).

Every policy sees the realized length of every request (the "Oracle" setting of App. A.2) and returns an
`Assignment`: the replica of each request, each replica's exact all-admit makespan (App. D) and the step makespan
(the slowest replica). Tail replicas, where a policy has them, are the last m, R−m..R−1 (as in `router`).
Exact definitions and the choices made where the paper is silent are in docs/baselines.md.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar, TypeVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tailsieve.errors import ConfigError
from tailsieve.inputs import check_replicas, check_tail_replicas
from tailsieve.model.balancing import improve
from tailsieve.model.curves import TpotCurve
from tailsieve.model.makespan import dealt_makespans, lane_makespans, makespan
from tailsieve.model.topq_search import search
from tailsieve.registry import Registry

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]
Info = Mapping[str, int | float]

@dataclass(frozen=True, slots=True, eq=False)
class GroupBatch:
    """One rollout step: `lengths[g, j]` is the known length of response j of prompt group g (N × G)."""

    lengths: IntArray
    group_ids: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        arr = np.array(self.lengths)
        if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
            raise ConfigError(f"group lengths must be a non-empty N × G array, got shape {arr.shape}")
        if arr.dtype.kind not in "iuf" or not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
            raise ConfigError("group lengths must be whole numbers of tokens")
        if arr.min() < 0:
            raise ConfigError(f"group lengths must be non-negative, got {arr.min()}")
        out = arr.astype(np.int64)
        out.setflags(write=False)
        object.__setattr__(self, "lengths", out)
        if self.group_ids is not None:
            ids = tuple(str(i) for i in self.group_ids)
            if len(ids) != out.shape[0]:
                raise ConfigError(f"{len(ids)} group ids for {out.shape[0]} groups")
            object.__setattr__(self, "group_ids", ids)

    @classmethod
    def from_groups(cls, groups: Sequence[Sequence[int]], group_ids: Sequence[str] | None = None) -> GroupBatch:
        """A batch from equal-size groups of lengths (one sequence per prompt group)."""
        sizes = {len(g) for g in groups}
        if len(sizes) > 1:
            raise ConfigError(f"all groups must have the same size, got sizes {sorted(sizes)}")
        return cls(np.asarray(groups), None if group_ids is None else tuple(group_ids))

    @property
    def n_groups(self) -> int:
        """N, the number of prompt groups (routing units)."""
        return int(self.lengths.shape[0])

    @property
    def group_size(self) -> int:
        """G, responses per prompt group."""
        return int(self.lengths.shape[1])

    @property
    def n_requests(self) -> int:
        """N·G, the number of requests."""
        return int(self.lengths.size)


@dataclass(frozen=True, slots=True, eq=False)
class Assignment:
    """A routing decision: `replica[g, j]` serves request j of group g; exact per-replica makespans (App. D)."""

    policy: str
    replica: IntArray
    replica_makespans_s: FloatArray
    info: Info = field(default_factory=lambda: MappingProxyType({}))

    @property
    def makespan_s(self) -> float:
        """T_step = max_r T_r, the step makespan (App. D)."""
        return float(self.replica_makespans_s.max())

    @property
    def n_replicas(self) -> int:
        """R, the number of replicas (including idle ones)."""
        return int(self.replica_makespans_s.size)


def make_assignment(
    policy: str, batch: GroupBatch, replica: ArrayLike, replicas: int, curve: TpotCurve, **info: int | float
) -> Assignment:
    """Evaluate a replica per request (N × G), or per group (N,) for whole groups, exactly (App. D)."""
    rep = np.array(replica, dtype=np.int64)
    if rep.shape == (batch.n_groups,):
        rep = np.repeat(rep[:, None], batch.group_size, axis=1)
    if rep.shape != batch.lengths.shape:
        raise ValueError(f"replica array has shape {rep.shape}, batch has {batch.lengths.shape}")
    spans = lane_makespans(batch.lengths.ravel(), rep.ravel(), replicas, curve)
    rep.setflags(write=False)
    spans.setflags(write=False)
    return Assignment(policy, rep, spans, MappingProxyType(dict(info)))


def verify_assignment(batch: GroupBatch, a: Assignment, curve: TpotCurve, *, group_atomic: bool) -> None:
    """Raise ValueError unless `a` routes every request exactly once (groups whole if promised), makespans exact."""
    if a.replica.shape != batch.lengths.shape:
        raise ValueError(f"{a.policy}: replica array has shape {a.replica.shape}, batch has {batch.lengths.shape}")
    if a.replica.min() < 0 or a.replica.max() >= a.n_replicas:
        raise ValueError(f"{a.policy}: replica indices outside 0..{a.n_replicas - 1}")
    if group_atomic and np.any(a.replica != a.replica[:, :1]):
        raise ValueError(f"{a.policy}: a prompt group is split across replicas")
    flat, rep = batch.lengths.ravel(), a.replica.ravel()
    want = np.array([makespan(flat[rep == r], curve) for r in range(a.n_replicas)])
    if not np.allclose(a.replica_makespans_s, want, rtol=1e-12, atol=1e-12):
        raise ValueError(f"{a.policy}: per-replica makespans disagree with the all-admit makespan")


class Policy(ABC):
    """A known-length routing policy; `name`, `group_atomic` and `min_replicas` are set per class."""

    __slots__ = ()
    name: ClassVar[str] = ""
    group_atomic: ClassVar[bool] = True
    min_replicas: ClassVar[int] = 1

    @abstractmethod
    def assign(self, batch: GroupBatch, replicas: int, curve: TpotCurve) -> Assignment:
        """Route every request of `batch` onto `replicas` identical replicas."""

    def check_replicas(self, replicas: int) -> None:
        """ConfigError unless `replicas` is an integer ≥ this policy's minimum (`inputs.check_replicas`)."""
        check_replicas(self.name, self.min_replicas, replicas)


def _policy_class(obj: object) -> str | None:
    return None if isinstance(obj, type) and issubclass(obj, Policy) else "not a subclass of Policy"


def _named(name: str, cls: type[Policy]) -> None:
    cls.name = name


# the known-length baselines (`tailsieve.registry.Registry`; plugins: `pkg.module:Class`, group tailsieve.baselines)
POLICIES: Registry[type[Policy]] = Registry("policy", "tailsieve.baselines", check=_policy_class, on_add=_named)
P = TypeVar("P", bound=Policy)


def register(name: str) -> Callable[[type[P]], type[P]]:
    """Class decorator: add a policy to `POLICIES` under `name` (a name taken by another class is refused)."""
    return POLICIES.register(name)


def get_policy(name: str, **params: int | float | None) -> Policy:
    """A policy instance by registry name (the registry's one-line error listing the valid names otherwise)."""
    return POLICIES.resolve(name)(**params)


def assign_checked(policy: Policy, batch: GroupBatch, replicas: int, curve: TpotCurve) -> Assignment:
    """`policy.assign(batch, replicas, curve)`, checked to be an `Assignment` (a plugin's wrong result is one line
    naming the policy and what it returned)."""
    a = policy.assign(batch, replicas, curve)
    if not isinstance(a, Assignment):
        raise POLICIES.returned(policy.name, a, "an Assignment from assign()")
    return a


def lpt(weights: ArrayLike, bins: int) -> IntArray:
    """Longest-processing-time-first: heaviest item onto the currently lightest bin (ties: lowest index)."""
    w = np.asarray(weights, dtype=np.int64)
    out = np.empty(w.size, dtype=np.int64)
    loads = np.zeros(bins, dtype=np.int64)
    for i in np.argsort(-w, kind="stable"):
        b = int(np.argmin(loads))
        out[i] = b
        loads[b] += w[i]
    return out


def balance(weights: ArrayLike, bins: int) -> IntArray:
    """Bin of each item: LPT followed by pairwise improvement (never a higher maximum load than LPT)."""
    return improve(weights, lpt(weights, bins), bins)


def _max_load(weights: IntArray, bin_of: IntArray, bins: int) -> int:
    return int(np.bincount(bin_of, weights=weights, minlength=bins).max())


def _pools(is_tail: NDArray[np.bool_], m: int, replicas: int) -> IntArray:
    """Round-robin within each pool in array order: bulk items over 0..R−m−1, tail items over R−m..R−1 (per row)."""
    tpos = np.cumsum(is_tail, axis=-1) - 1
    bpos = np.cumsum(~is_tail, axis=-1) - 1
    bulk = bpos % (replicas - m)
    if m == 0:
        return bulk
    return np.where(is_tail, replicas - m + tpos % m, bulk)


@register("uniform")
@dataclass(frozen=True, slots=True)
class Uniform(Policy):
    """Uniform group routing (App. A.2): group g goes whole to replica g mod R, in batch order."""

    def assign(self, batch: GroupBatch, replicas: int, curve: TpotCurve) -> Assignment:
        """Round-robin whole groups over the replicas."""
        self.check_replicas(replicas)
        return make_assignment(self.name, batch, np.arange(batch.n_groups) % replicas, replicas, curve)


@register("uniform-oracle")
@dataclass(frozen=True, slots=True)
class UniformOracle(Policy):
    """Uniform Oracle (App. A.2): whole groups, known group token totals balanced across replicas."""

    def assign(self, batch: GroupBatch, replicas: int, curve: TpotCurve) -> Assignment:
        """LPT over group totals, then pairwise group moves/swaps out of the heaviest replica."""
        self.check_replicas(replicas)
        totals = batch.lengths.sum(axis=1)
        start = lpt(totals, replicas)
        groups = improve(totals, start, replicas)
        return make_assignment(self.name, batch, groups, replicas, curve,
                               max_load_tokens=_max_load(totals, groups, replicas),
                               lpt_max_load_tokens=_max_load(totals, start, replicas))


@register("streamrl-oracle")
@dataclass(frozen=True, slots=True)
class StreamRLOracle(Policy):
    """StreamRL-style Oracle (App. A.2): the longest `fraction` of requests on `dedicated` replicas, groups split.

    `dedicated=None` picks the count in 1..R−1 with the smallest exact makespan (ties: fewer replicas).
    """

    group_atomic: ClassVar[bool] = False
    min_replicas: ClassVar[int] = 2
    fraction: float = 0.2
    dedicated: int | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.fraction < 1.0:
            raise ConfigError(f"streamrl-oracle: fraction must lie strictly between 0 and 1, got {self.fraction}")
        if self.dedicated is not None and self.dedicated < 1:
            raise ConfigError(f"streamrl-oracle: dedicated must be at least 1, got {self.dedicated}")

    def assign(self, batch: GroupBatch, replicas: int, curve: TpotCurve) -> Assignment:
        """Both sides round-robin in descending length order (request granularity)."""
        self.check_replicas(replicas)
        if self.dedicated is not None and self.dedicated >= replicas:
            raise ConfigError(f"streamrl-oracle: dedicated must lie in 1..{replicas - 1} (R={replicas} replicas), "
                              f"got {self.dedicated}")
        flat = batch.lengths.ravel()
        n = flat.size
        k = min(n, max(1, math.ceil(self.fraction * n - 1e-9)))
        by_rank = np.argsort(-flat, kind="stable")  # request index at each descending-length position
        desc = flat[by_rank]
        ds = np.arange(1, replicas) if self.dedicated is None else np.array([self.dedicated])
        spans = [max(dealt_makespans(desc[:k], int(d), curve).max(), dealt_makespans(desc[k:], replicas - int(d),
                                                                                         curve).max()) for d in ds]
        best = int(ds[int(np.argmin(spans))])
        lanes = np.empty(n, dtype=np.int64)
        lanes[by_rank] = _pools(np.arange(n) < k, best, replicas)
        return make_assignment(self.name, batch, lanes.reshape(batch.lengths.shape), replicas, curve,
                               dedicated=best, isolated_requests=k)


@register("seer-oracle")
@dataclass(frozen=True, slots=True)
class SeerOracle(Policy):
    """Seer-style Oracle (App. A.2): groups split, known request lengths balanced as tokens per replica."""

    group_atomic: ClassVar[bool] = False

    def assign(self, batch: GroupBatch, replicas: int, curve: TpotCurve) -> Assignment:
        """LPT over request lengths, then pairwise request moves/swaps out of the heaviest replica."""
        self.check_replicas(replicas)
        flat = batch.lengths.ravel()
        start = lpt(flat, replicas)
        rep = improve(flat, start, replicas)
        return make_assignment(self.name, batch, rep.reshape(batch.lengths.shape), replicas, curve,
                               max_load_tokens=_max_load(flat, rep, replicas),
                               lpt_max_load_tokens=_max_load(flat, start, replicas))


def group_tail_rank(batch: GroupBatch) -> IntArray:
    """Rank of each group by longest member, descending (ties: larger group total, then earlier group)."""
    order = np.lexsort((np.arange(batch.n_groups), -batch.lengths.sum(axis=1), -batch.lengths.max(axis=1)))
    rank = np.empty(batch.n_groups, dtype=np.int64)
    rank[order] = np.arange(batch.n_groups)
    return rank


def topq_lanes(rank: IntArray, qs: IntArray, m: int, replicas: int) -> IntArray:
    """Replica of each group for every q in `qs` (rows): top-q by `rank` round-robin on R−m..R−1, rest on the others."""
    is_tail = rank[None, :] < np.asarray(qs, dtype=np.int64)[:, None]
    return _pools(is_tail, m, replicas)


@register("topq")
@dataclass(frozen=True, slots=True)
class TopQ(Policy):
    """Top-(q, m) group isolation (§2.2, §2.4): q groups with the longest member on m tail replicas; (0, 0) is uniform.

    Each pool is filled round-robin in batch order.
    """

    q: int = 0
    m: int = 0

    def __post_init__(self) -> None:
        for key, value in (("q", self.q), ("m", self.m)):
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
                raise ConfigError(f"topq: {key} must be a non-negative integer, got {key}={value}")
        if (self.q > 0) != (self.m > 0):
            raise ConfigError(f"topq: q and m must both be 0 (uniform) or both positive, got q={self.q}, m={self.m}")

    def assign(self, batch: GroupBatch, replicas: int, curve: TpotCurve) -> Assignment:
        """Route whole groups by the fixed (q, m) split."""
        self.check_replicas(replicas)
        if self.q > batch.n_groups:
            raise ConfigError(f"topq: q must lie in 0..{batch.n_groups} (the number of groups), got q={self.q}")
        check_tail_replicas(self.m, replicas)
        groups = topq_lanes(group_tail_rank(batch), np.array([self.q]), self.m, replicas)[0]
        return make_assignment(self.name, batch, groups, replicas, curve, q=self.q, m=self.m)


@register("topq-best")
@dataclass(frozen=True, slots=True)
class TopQBest(Policy):
    """A known-length top-q heuristic: the best top-(q, m) split of the step's batch in hindsight, by exact makespan
    over q in 1..N, m in 1..R−1 and the uniform (0, 0).

    Ties prefer (0, 0), then fewer tail replicas, then fewer groups. Not a bound on what routing can reach: it splits
    uniform's own batch, with no over-provisioning (no extra groups started, none cut) and no redraws, so a policy
    that over-provisions and cuts (tailsieve) can beat it (rare-cap: 1.54× against its 1.17×).
    """

    min_replicas: ClassVar[int] = 2

    def assign(self, batch: GroupBatch, replicas: int, curve: TpotCurve) -> Assignment:
        """Branch and bound over the splits (`topq_search`): the full evaluation's answer without its R·N²·G cost."""
        self.check_replicas(replicas)
        rank = group_tail_rank(batch)

        def lanes(q: int, m: int) -> IntArray:
            return np.asarray(topq_lanes(rank, np.array([q]), m, replicas)[0], dtype=np.int64)

        best = search(batch.lengths, rank, replicas, curve, lanes)
        return make_assignment(self.name, batch, lanes(best.q, best.m), replicas, curve, q=best.q, m=best.m)
