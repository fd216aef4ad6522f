"""Event-driven replica simulator (mechanism): continuous batching, advanced from one completion to the next.

One decode iteration with b running requests takes τ(b) (plus, optionally, a KV-traffic term proportional to
the context tokens the running requests hold). Time jumps from event to event (a request finishing); inside an
interval the iteration time grows linearly with the context, so the interval's duration is an arithmetic series
in closed form. Options (all off by default): a `max_num_seqs` admission cap with an FCFS queue, a KV-traffic
term, and a prefill stall per admitted prompt token. With every option off the result equals the all-admit closed
form of §2.1 exactly (`makespan.finish_times`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tailsieve.errors import ConfigError
from tailsieve.model.curves import TpotCurve
from tailsieve.model.makespan import as_lengths
from tailsieve.model.paged import PagedLimits, PagedTrace, run_paged
from tailsieve.simulation.replica_run import ReplicaRun, cut_boundary, empty_segments

__all__ = ["ReplicaConfig", "ReplicaRun", "resume_paged", "resume_replica", "run_replica"]

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    """Serving options of a simulated replica (all off by default = the all-admit model)."""

    max_num_seqs: int | None = None
    kv_ms_per_1k_tokens: float = 0.0
    prefill_ms_per_token: float = 0.0
    tool_wait_s: float = 0.0  # between two turns of a multi-turn request (`run_replica(turns=)`); see _tool_loop
    # the paged engine (`model.paged`, docs/simulator.md); any of these on selects it
    kv_tokens: int | None = None  # KV capacity in tokens (None: unbounded)
    block_size: int = 16
    max_num_batched_tokens: int | None = None  # chunked prefill's token budget per iteration (None: prefill stalls)
    prefix_caching: bool = False  # a group's shared prompt is prefilled once per replica while its blocks stay

    def __post_init__(self) -> None:
        if self.max_num_seqs is not None and self.max_num_seqs < 1:
            raise ConfigError(f"max_num_seqs must be >= 1 or None, got {self.max_num_seqs}")
        if not (math.isfinite(self.kv_ms_per_1k_tokens) and self.kv_ms_per_1k_tokens >= 0):
            raise ConfigError(f"kv_ms_per_1k_tokens must be finite and >= 0, got {self.kv_ms_per_1k_tokens}")
        if not (math.isfinite(self.prefill_ms_per_token) and self.prefill_ms_per_token >= 0):
            raise ConfigError(f"prefill_ms_per_token must be finite and >= 0, got {self.prefill_ms_per_token}")
        if not (math.isfinite(self.tool_wait_s) and self.tool_wait_s >= 0):
            raise ConfigError(f"tool_wait_s must be finite and >= 0, got {self.tool_wait_s}")
        if not 1 <= self.block_size <= 1024:
            raise ConfigError(f"block_size must be in [1, 1024], got {self.block_size}")
        if self.kv_tokens is not None and self.kv_tokens < self.block_size:
            raise ConfigError(f"kv_tokens must be >= block_size ({self.block_size}) or None, got {self.kv_tokens}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ConfigError(f"max_num_batched_tokens must be >= 1 or None, got {self.max_num_batched_tokens}")

    @property
    def paged(self) -> bool:
        """True when the paged engine runs (KV capacity, chunked prefill or prefix caching on)."""
        return self.kv_tokens is not None or self.max_num_batched_tokens is not None or self.prefix_caching

    def limits(self) -> PagedLimits:
        """The paged engine's limits (blocks of `block_size` tokens; per-token terms in seconds)."""
        return PagedLimits(None if self.kv_tokens is None else self.kv_tokens // self.block_size, self.block_size,
                           self.max_num_seqs, self.max_num_batched_tokens, self.prefix_caching,
                           self.kv_ms_per_1k_tokens / 1e6, self.prefill_ms_per_token / 1e3)

    @property
    def all_admit(self) -> bool:
        """True when the replica follows the closed-form all-admit model."""
        return (self.max_num_seqs is None and self.kv_ms_per_1k_tokens == 0 and self.prefill_ms_per_token == 0
                and not self.paged)


def run_replica(
    lengths: ArrayLike,
    curve: TpotCurve,
    config: ReplicaConfig | None = None,
    prompt_tokens: ArrayLike | None = None,
    turns: ArrayLike | None = None,
    prefix_keys: ArrayLike | None = None,
) -> ReplicaRun:
    """Simulate one replica serving `lengths` (submitted in this order at t = 0) until all finish; `turns` (per
    request, default 1) splits a request into decode turns separated by `config.tool_wait_s` of tool latency;
    `prefix_keys` (paged engine with prefix caching) name the shared prompt of each request (its group)."""
    cfg = config or ReplicaConfig()
    lens = as_lengths(lengths).astype(np.int64)
    n = lens.size
    prompts = np.zeros(n, np.int64) if prompt_tokens is None else np.asarray(prompt_tokens, np.int64)
    if prompts.shape != lens.shape:
        raise ValueError(f"prompt_tokens has shape {prompts.shape}, lengths has {lens.shape}")
    if turns is not None and cfg.tool_wait_s > 0:
        parts = _turn_split(lens, np.asarray(turns, np.int64))
        if parts.shape[1] > 1:
            if cfg.paged:
                raise ConfigError("the paged engine (kv_tokens, max_num_batched_tokens, prefix_caching) does not "
                                  "simulate multi-turn tool waits; turn those off for an agent workload")
            return _tool_loop(lens, prompts, parts, curve, cfg)
    if cfg.paged:
        keys = None if prefix_keys is None else np.asarray(prefix_keys, np.int64)
        return _paged_run(lens, prompts, keys, curve, cfg, run_paged(lens, prompts, keys, curve.table(max(n, 1)),
                                                                     cfg.limits()))
    if cfg.all_admit:
        return _all_admit(lens, curve)
    return _event_loop(lens, prompts, curve, cfg)


def _paged_run(lens: IntArray, prompts: IntArray, keys: IntArray | None, curve: TpotCurve, cfg: ReplicaConfig,
               tr: PagedTrace) -> ReplicaRun:
    """A `ReplicaRun` of the paged engine (start_iter: each request's first decode iteration, 0 if never)."""
    start = np.zeros(lens.size, np.int64)
    if tr.spans.size:
        first = np.full(lens.size, np.iinfo(np.int64).max)
        np.minimum.at(first, tr.spans[:, 0], tr.spans[:, 1])
        start = np.where(first == np.iinfo(np.int64).max, 0, first)
    k0, t0, sn, sb, si = tr.seg
    return ReplicaRun(lens, tr.finish_s, start, k0, t0, sn, sb, si, paged=tr, inputs=(prompts, keys))


def resume_paged(run: ReplicaRun, keep: ArrayLike, cut_s: float, curve: TpotCurve, config: ReplicaConfig
                 ) -> ReplicaRun:
    """A paged run rerun with the requests not in `keep` leaving at the first iteration boundary at or after
    `cut_s` (the same timeline up to there: the engine is deterministic)."""
    assert run.inputs is not None
    prompts, keys = run.inputs
    k, _ = cut_boundary(run, cut_s)
    kept = np.asarray(keep, dtype=bool)
    tr = run_paged(run.lengths, prompts, keys, curve.table(max(run.lengths.size, 1)), config.limits(), (k, kept))
    return _paged_run(run.lengths, prompts, keys, curve, config, tr)


def _all_admit(lens: IntArray, curve: TpotCurve) -> ReplicaRun:
    """Closed form (§2.1), one segment per distinct length: vectorised, no per-event Python loop."""
    n = lens.size
    start = np.zeros(n, np.int64)
    if n == 0:
        return empty_segments(lens, np.zeros(0), start)
    tau = curve.table(n)
    asc = np.sort(lens)
    k_end = np.unique(asc)  # iteration counts at which some request finishes
    k_end = k_end[k_end > 0]
    if k_end.size == 0:
        return empty_segments(lens, np.zeros(n), start)
    k0 = np.concatenate(([0], k_end[:-1]))
    active = n - np.searchsorted(asc, k0, side="right")  # requests longer than k0
    base = tau[active]
    seg_n = k_end - k0
    t_end = np.cumsum(seg_n * base)
    t0 = np.concatenate(([0.0], t_end[:-1]))
    finish = np.zeros(n)
    pos = lens > 0
    finish[pos] = t_end[np.searchsorted(k_end, lens[pos])]
    return ReplicaRun(lens, finish, start, k0.astype(np.int64), t0, seg_n.astype(np.int64), base, np.zeros_like(base))


def _event_loop(lens: IntArray, prompts: IntArray, curve: TpotCurve, cfg: ReplicaConfig) -> ReplicaRun:
    """General case: FCFS admission under `max_num_seqs`, prefill stalls, KV-traffic term."""
    n = lens.size
    cap = n if cfg.max_num_seqs is None else min(cfg.max_num_seqs, n)
    tau = curve.table(max(cap, 1))
    kv = cfg.kv_ms_per_1k_tokens / 1e6  # seconds per context token per iteration
    pre = cfg.prefill_ms_per_token / 1e3
    finish = np.zeros(n)
    start = np.zeros(n, np.int64)
    remaining = lens.copy()
    context = prompts.astype(np.float64).copy()
    segs: list[tuple[int, float, int, float, float]] = []
    t, k, nxt = 0.0, 0, 0
    running = np.zeros(0, np.int64)
    while True:
        if running.size < cap and nxt < n:  # admit FCFS up to the cap, stall for their prefill
            take = np.arange(nxt, min(n, nxt + cap - running.size))
            nxt = int(take[-1]) + 1
            start[take] = k
            t += pre * float(prompts[take].sum())
            done_now = take[remaining[take] == 0]
            finish[done_now] = t
            running = np.concatenate((running, take[remaining[take] > 0]))
            continue
        if running.size == 0:
            break
        b = running.size
        steps = int(remaining[running].min())
        base = float(tau[b]) + kv * float(context[running].sum())
        inc = kv * b
        segs.append((k, t, steps, base, inc))
        t += steps * base + inc * steps * (steps - 1) / 2.0
        k += steps
        remaining[running] -= steps
        context[running] += steps
        done = remaining[running] == 0
        finish[running[done]] = t
        running = running[~done]
    if not segs:
        return empty_segments(lens, finish, start)
    k0, t0, sn, sb, si = (np.asarray(c) for c in zip(*segs, strict=True))
    return ReplicaRun(lens, finish, start, k0.astype(np.int64), t0.astype(np.float64), sn.astype(np.int64),
                      sb.astype(np.float64), si.astype(np.float64))


def resume_replica(
    run: ReplicaRun,
    keep: ArrayLike,
    cut_s: float,
    curve: TpotCurve,
    config: ReplicaConfig | None = None,
    prompt_tokens: ArrayLike | None = None,
) -> FloatArray:
    """Finish times of `run`'s requests when those not in `keep` are aborted at `cut_s` (a bulk cutoff that spares
    pinned groups): the iteration in flight at `cut_s` completes, the aborted requests leave (running or queued),
    and the kept ones continue alone, FCFS admission included. Aborted requests unfinished by then get inf."""
    cfg = config or ReplicaConfig()
    kept = np.asarray(keep, dtype=bool)
    if run.paged is not None:
        return resume_paged(run, kept, cut_s, curve, cfg).finish_s
    k, t = cut_boundary(run, cut_s)
    admitted = run.start_iter < k
    gen = np.where(admitted, np.clip(k - run.start_iter, 0, run.lengths), 0)
    done = admitted & (gen >= run.lengths)
    out = run.finish_s.astype(np.float64, copy=True)
    if (kept | done).all():  # nothing aborted here: the run stands
        return out
    out[~kept & ~done] = np.inf
    live = kept & ~done
    if not live.any():
        return out
    prompts = np.zeros(run.lengths.size, np.int64) if prompt_tokens is None else np.asarray(prompt_tokens, np.int64)
    running, queue = np.flatnonzero(live & admitted), np.flatnonzero(live & ~admitted)
    remaining = (run.lengths - gen).astype(np.int64)
    context = (prompts + gen).astype(np.float64)
    cont = _continue(t, running, queue, remaining, context, prompts, curve, cfg)
    out[live] = cont[live]
    return out


def _continue(t: float, running: IntArray, queue: IntArray, remaining: IntArray, context: FloatArray,
              prompts: IntArray, curve: TpotCurve, cfg: ReplicaConfig) -> FloatArray:
    """The event loop of `_event_loop` from a given state: time t, running requests, FCFS queue, remaining tokens
    and contexts. Returns finish times (inf for requests not in `running` or `queue`)."""
    cap = running.size + queue.size if cfg.max_num_seqs is None else cfg.max_num_seqs
    tau = curve.table(max(cap, running.size, 1))
    kv = cfg.kv_ms_per_1k_tokens / 1e6
    pre = cfg.prefill_ms_per_token / 1e3
    finish = np.full(remaining.size, np.inf)
    nxt = 0
    while True:
        if running.size < cap and nxt < queue.size:
            take = queue[nxt : nxt + cap - running.size]
            nxt += take.size
            t += pre * float(prompts[take].sum())
            finish[take[remaining[take] == 0]] = t
            running = np.concatenate((running, take[remaining[take] > 0]))
            continue
        if running.size == 0:
            return finish
        b = running.size
        steps = int(remaining[running].min())
        base = float(tau[b]) + kv * float(context[running].sum())
        inc = kv * b
        t += steps * base + inc * steps * (steps - 1) / 2.0
        remaining[running] -= steps
        context[running] += steps
        ended = remaining[running] == 0
        finish[running[ended]] = t
        running = running[~ended]


def _turn_split(lens: IntArray, turns: IntArray) -> IntArray:
    """Tokens of each turn (n × T): T = clip(turns, 1, length) turns of near-equal size, the later ones larger."""
    if turns.shape != lens.shape:
        raise ValueError(f"turns has shape {turns.shape}, lengths has {lens.shape}")
    t = np.clip(turns, 1, np.maximum(lens, 1))
    j = np.arange(int(t.max()) + 1 if t.size else 1)[None, :]
    edges = (np.minimum(j, t[:, None]) * lens[:, None]) // t[:, None]  # floor(j·L/T), flat after the last turn
    out: IntArray = np.diff(edges, axis=1)
    return out


def _tool_loop(lens: IntArray, prompts: IntArray, parts: IntArray, curve: TpotCurve, cfg: ReplicaConfig) -> ReplicaRun:
    """Multi-turn requests: after each turn but the last a request waits `tool_wait_s` without decoding. It keeps its
    slot (counts against `max_num_seqs`) but leaves the decode batch (neither τ(b) nor the KV term counts it); it
    rejoins at the first iteration boundary at or after its wake time. Otherwise as `_event_loop`."""
    n, n_turns = parts.shape
    cap = n if cfg.max_num_seqs is None else min(cfg.max_num_seqs, n)
    tau = curve.table(max(cap, 1))
    kv, pre = cfg.kv_ms_per_1k_tokens / 1e6, cfg.prefill_ms_per_token / 1e3
    finish, start = np.zeros(n), np.zeros(n, np.int64)
    turn_iter = np.full((n, n_turns), -1, np.int64)
    last = (parts > 0).sum(axis=1) - 1  # index of each request's last turn (-1: no tokens)
    turn, remaining = np.zeros(n, np.int64), parts[:, 0].copy()
    context = prompts.astype(np.float64).copy()
    wake = np.full(n, np.inf)  # waiting requests' wake times
    segs: list[_Segment] = []
    t, k, nxt, held = 0.0, 0, 0, 0
    running = np.zeros(0, np.int64)
    while True:
        if held < cap and nxt < n:  # admit FCFS while slots are free, stall for their prefill
            take = np.arange(nxt, min(n, nxt + cap - held))
            nxt, t = int(take[-1]) + 1, t + pre * float(prompts[take].sum())
            start[take] = k
            finish[take[last[take] < 0]] = t
            live = take[last[take] >= 0]
            turn_iter[live, 0] = k
            running, held = np.concatenate((running, live)), held + live.size
            continue
        woke = np.flatnonzero(wake <= t * _TIE)
        if woke.size:  # tool results are back: rejoin the batch at this iteration boundary
            wake[woke] = np.inf
            turn_iter[woke, turn[woke]] = k
            running = np.concatenate((running, woke))
        if running.size == 0:
            if not np.isfinite(wake).any():
                break
            t = float(wake.min())  # every held request waits on a tool: idle until the first returns
            continue
        b = running.size
        base, inc = float(tau[b]) + kv * float(context[running].sum()), kv * b
        steps = _steps_until(int(remaining[running].min()), base, inc, t, float(wake.min()))
        segs.append((k, t, steps, base, inc))
        t, k = t + steps * base + inc * steps * (steps - 1) / 2.0, k + steps
        remaining[running] -= steps
        context[running] += steps
        ended = running[remaining[running] == 0]
        running = running[remaining[running] > 0]
        done = ended[turn[ended] == last[ended]]
        paused = ended[turn[ended] < last[ended]]
        finish[done], held = t, held - done.size
        turn[paused] += 1
        remaining[paused], wake[paused] = parts[paused, turn[paused]], t + cfg.tool_wait_s
    return _with_turns(_runs(lens, finish, start, segs), turn_iter, parts)


def _steps_until(bound: int, base: float, inc: float, t: float, wake: float) -> int:
    """Iterations to run from t: `bound`, or fewer so that the segment ends at the first boundary at or after `wake`
    (the same arithmetic that advances the clock, so the waking request rejoins exactly there)."""
    def end(m: int) -> float:
        return t + m * base + inc * m * (m - 1) / 2.0

    if not math.isfinite(wake) or end(bound) * _TIE < wake:
        return bound
    lo, hi = 1, bound  # smallest m in [1, bound] with end(m) >= wake (monotone in m)
    while lo < hi:
        mid = (lo + hi) // 2
        if end(mid) * _TIE >= wake:
            hi = mid
        else:
            lo = mid + 1
    return lo


_TIE = 1 + 1e-12  # a wake time within rounding of an iteration boundary counts as reached there
_Segment = tuple[int, float, int, float, float]  # (k0, t0, iterations, base, inc)


def _runs(lens: IntArray, finish: FloatArray, start: IntArray, segs: list[_Segment]) -> ReplicaRun:
    """A `ReplicaRun` from the event loop's segment list."""
    if not segs:
        return empty_segments(lens, finish, start)
    k0, t0, sn, sb, si = (np.asarray(c) for c in zip(*segs, strict=True))
    return ReplicaRun(lens, finish, start, k0.astype(np.int64), t0.astype(np.float64), sn.astype(np.int64),
                      sb.astype(np.float64), si.astype(np.float64))


def _with_turns(run: ReplicaRun, turn_iter: IntArray, parts: IntArray) -> ReplicaRun:
    """`run` with its per-turn start iterations (what `tokens_at` needs when requests pause between turns)."""
    return ReplicaRun(run.lengths, run.finish_s, run.start_iter, run.seg_k0, run.seg_t0, run.seg_n, run.seg_base,
                      run.seg_inc, turn_iter, parts)
