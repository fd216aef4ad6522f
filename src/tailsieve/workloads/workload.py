"""Multi-round workloads (§2.3, App. A.5, App. B): which prompts come, and how long each generation of them is.

A `Workload` answers `lengths(prompt, generation, step, G)`: the G response lengths of the `generation`-th
generation of a prompt at rollout step `step`. Modes: `recorded` (exact cyclic replay of a trace), `resample`
(i.i.d. draws with common random numbers) and `synthetic` (the paper-calibrated generator of `synthetic.py`).
The prompt order itself (`PromptStream`) lives in `tailsieve.policy.stream`: the router draws from it without
importing any trace loader.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from tailsieve.errors import ConfigError, TraceError
from tailsieve.hashing import stable_hash
from tailsieve.inputs import excerpt
from tailsieve.model.tailstrength import STRONG_TAIL_RATIO, WEAK_TAIL_RATIO
from tailsieve.workloads.regimes import REGIMES
from tailsieve.workloads.synthetic import SyntheticConfig, SyntheticModel
from tailsieve.workloads.traces import Trace, bundled_trace_names, load_trace, require_tokens

_TAG_RESAMPLE = 21


class ReplayMode(StrEnum):
    """How a trace becomes per-generation lengths."""

    RECORDED = "recorded"
    RESAMPLE = "resample"
    SYNTHETIC = "synthetic"


class LengthSource(Protocol):
    """What a workload delegates to."""

    def lengths(self, prompt_id: str, generation: int, step: int, group_size: int) -> NDArray[np.int64]: ...


class GeneratorSource(LengthSource, Protocol):
    """A generator: a length source that also names its prompt set and its cap."""

    @property
    def prompts(self) -> tuple[str, ...]: ...

    @property
    def max_length(self) -> int: ...


@runtime_checkable
class MultiTurnSource(Protocol):
    """A source whose samples are several decode turns separated by tool calls (`agent-search`)."""

    @property
    def tool_wait_s(self) -> float: ...

    def turns(self, prompt_id: str, generation: int, step: int, group_size: int) -> NDArray[np.int64]: ...


# ---------------------------------------------------------------------------------------------------- trace sources


@dataclass(frozen=True, slots=True)
class _PromptSamples:
    """One prompt's recorded samples: all of them in file order, and grouped by step when the trace has steps."""

    all: NDArray[np.int64]
    steps: NDArray[np.int64] | None = None  # distinct steps, ascending
    by_step: tuple[NDArray[np.int64], ...] = ()


def _group_trace(trace: Trace) -> tuple[tuple[str, ...], dict[str, _PromptSamples], dict[str, int]]:
    """Distinct prompts (first-appearance order), their samples, and their prompt token counts when known."""
    ids = trace.prompt_id
    uniq, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    prompts = tuple(str(p) for p in uniq[order])
    by_row = np.argsort(inverse, kind="stable")  # rows grouped by prompt, file order inside each
    bounds = np.searchsorted(inverse[by_row], np.arange(uniq.size + 1))
    samples: dict[str, _PromptSamples] = {}
    ptoks: dict[str, int] = {}
    for u in range(uniq.size):
        rows = by_row[bounds[u] : bounds[u + 1]]
        pid = str(uniq[u])
        lens = trace.length[rows]
        if trace.step is not None:
            st = trace.step[rows]
            steps = np.unique(st)
            groups = tuple(lens[st == s] for s in steps)
            samples[pid] = _PromptSamples(all=lens, steps=steps, by_step=groups)
        else:
            samples[pid] = _PromptSamples(all=lens)
        if trace.prompt_tokens is not None:
            ptoks[pid] = int(np.median(trace.prompt_tokens[rows]))
    return prompts, samples, ptoks


def _check_args(generation: int, step: int, group_size: int) -> None:
    if generation < 0:
        raise ConfigError(f"generation must be >= 0, got {generation}")
    if step < 0:
        raise ConfigError(f"step must be >= 0, got {step}")
    if group_size < 1:
        raise ConfigError(f"group size must be >= 1, got {group_size}")


@dataclass(frozen=True, slots=True)
class RecordedSource:
    """Generation a of p takes p's recorded samples cyclically from index a·G (file order; step ignored)."""

    samples: dict[str, _PromptSamples]

    def lengths(self, prompt_id: str, generation: int, step: int, group_size: int) -> NDArray[np.int64]:
        """Exact cyclic replay."""
        rec = self.samples[prompt_id].all
        idx = (generation * group_size + np.arange(group_size)) % rec.size
        return rec[idx]


@dataclass(frozen=True, slots=True)
class ResampleSource:
    """G i.i.d. draws from p's samples (at the step nearest `step`), indices depending only on (seed, p, a)."""

    samples: dict[str, _PromptSamples]
    seed: int
    _memo: dict[tuple[str, int, int, int], NDArray[np.int64]] = field(default_factory=dict, repr=False, compare=False)

    def lengths(self, prompt_id: str, generation: int, step: int, group_size: int) -> NDArray[np.int64]:
        """Common-random-number resampling. Memoised: every policy of a `simulate` run (and the capture
        measurement) draws the same (prompt, generation) again, and seeding a generator is most of a draw's cost."""
        ps = self.samples[prompt_id]
        at = -1
        if ps.steps is not None and ps.steps.size > 1:
            at = int(np.argmin(np.abs(ps.steps - step)))  # ties: the earlier step
        key = (prompt_id, generation, at, group_size)
        out = self._memo.get(key)
        if out is None:
            pool = ps.all if at < 0 else ps.by_step[at]
            h = stable_hash(prompt_id)
            ss = np.random.SeedSequence([self.seed, _TAG_RESAMPLE, h & 0xFFFFFFFF, h >> 32, generation])
            u = np.random.default_rng(ss).random(group_size)
            out = pool[np.minimum((u * pool.size).astype(np.int64), pool.size - 1)]
            out.setflags(write=False)
            if len(self._memo) >= _MEMO_LIMIT:
                self._memo.clear()
            self._memo[key] = out
        return out


_MEMO_LIMIT = 1 << 18  # resampled groups kept per source (under 100 MB)


# --------------------------------------------------------------------------------------------------------- workload


@dataclass(frozen=True, slots=True, eq=False)
class Workload:
    """An immutable multi-round workload; all randomness derives from `seed`."""

    name: str
    prompts: tuple[str, ...]
    max_length: int | None
    mode: ReplayMode
    seed: int
    source: LengthSource = field(repr=False)
    description: str = ""
    trace: Trace | None = field(default=None, repr=False)
    _prompt_tokens: dict[str, int] = field(default_factory=dict, repr=False)
    _known: frozenset[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.prompts:
            raise ConfigError(f"workload {self.name}: no prompts")
        object.__setattr__(self, "_known", frozenset(self.prompts))

    def lengths(self, prompt_id: str, generation: int, step: int, group_size: int) -> NDArray[np.int64]:
        """The G response lengths of the `generation`-th generation of `prompt_id` at rollout step `step` (pure)."""
        _check_args(generation, step, group_size)
        if prompt_id not in self._known:
            raise ConfigError(f"workload {self.name}: unknown prompt id {excerpt(prompt_id)}")
        out = self.source.lengths(prompt_id, generation, step, group_size)
        out.setflags(write=False)
        return out

    def turns(self, prompt_id: str, generation: int, step: int, group_size: int) -> NDArray[np.int64]:
        """Decode turns of each of the G samples (pure, the same draw as `lengths`; 1 for single-turn sources)."""
        _check_args(generation, step, group_size)
        if prompt_id not in self._known:
            raise ConfigError(f"workload {self.name}: unknown prompt id {excerpt(prompt_id)}")
        if not isinstance(self.source, MultiTurnSource):
            return np.ones(group_size, dtype=np.int64)
        out = self.source.turns(prompt_id, generation, step, group_size)
        out.setflags(write=False)
        return out

    @property
    def tool_wait_s(self) -> float:
        """Tool latency between two turns of a sample (seconds; 0 for single-turn sources)."""
        return self.source.tool_wait_s if isinstance(self.source, MultiTurnSource) else 0.0

    def prompt_tokens(self, prompt_id: str) -> int | None:
        """Prompt length in tokens when the source records it (median over the prompt's rows), else None."""
        return self._prompt_tokens.get(prompt_id)

    @property
    def is_synthetic(self) -> bool:
        """Whether lengths come from the generator rather than a trace."""
        return self.mode is ReplayMode.SYNTHETIC


# ------------------------------------------------------------------------------------------------------ construction

_SYNTHETIC: dict[str, tuple[float | None, str]] = {
    "synthetic-math": (None, "synthetic math workload calibrated to the paper (P50 1160, P90 4115, 3% truncated)"),
    "synthetic-math-weak": (WEAK_TAIL_RATIO, "synthetic-math with a weak tail (App. A.5, P90/P50 = 1.5)"),
    "synthetic-math-strong": (STRONG_TAIL_RATIO, "synthetic-math with a strong tail (App. A.5, P90/P50 = 6)"),
}
_TRACE_DESCRIPTIONS = {
    "kodcode-r1": "DeepSeek-R1 answers to 232 KodCode questions, 3 samples each (default; Apache-2.0)",
    "kodcode-tests": "'answer and write unit tests' generations for 350 KodCode questions, 3 each (Apache-2.0)",
}
_TRACE_MAX_LENGTH = {"kodcode-r1": 16384}


def bundled_workloads() -> dict[str, str]:
    """Bundled workload names → one-line description (the traces first, the default first of all)."""
    names = bundled_trace_names()
    out = {n: _TRACE_DESCRIPTIONS.get(n, "bundled trace") for n in names}
    out.update({n: d for n, (_, d) in _SYNTHETIC.items()})
    out.update({n: d for n, (_, d) in REGIMES.items()})
    return out


def generator_names() -> tuple[str, ...]:
    """Names of the bundled generator-backed workloads (synthetic-math and its variants, then the regimes)."""
    return (*_SYNTHETIC, *REGIMES)


def synthetic_workload(
    name: str = "synthetic-math", *, seed: int = 0, config: SyntheticConfig | None = None
) -> Workload:
    """A generator-backed workload (§4.1 math workload; weak/strong tails via App. A.5; the issue-14 regimes)."""
    if config is None and name in REGIMES:
        factory, desc = REGIMES[name]
        return _generated(name, factory(seed), seed, desc)
    if config is None:
        if name not in _SYNTHETIC:
            raise ConfigError(f"unknown synthetic workload {excerpt(name)} (known: {', '.join(generator_names())})")
        config = SyntheticConfig(tail_ratio=_SYNTHETIC[name][0])
    model = SyntheticModel(config, seed=seed)
    return _generated(name, model, seed, _SYNTHETIC.get(name, (None, "synthetic workload"))[1])


def _generated(name: str, model: GeneratorSource, seed: int, desc: str) -> Workload:
    """The `Workload` around a generator."""
    return Workload(name=name, prompts=model.prompts, max_length=model.max_length, mode=ReplayMode.SYNTHETIC,
                    seed=seed, source=model, description=desc)


def trace_workload(trace: Trace, *, name: str, mode: ReplayMode = ReplayMode.RECORDED, seed: int = 0,
                   max_length: int | None = None, description: str = "") -> Workload:
    """A trace-backed workload in `recorded` or `resample` mode."""
    prompts, samples, ptoks = _group_trace(trace)
    source: LengthSource
    if mode is ReplayMode.RECORDED:
        source = RecordedSource(samples)
    elif mode is ReplayMode.RESAMPLE:
        source = ResampleSource(samples, seed)
    else:
        raise ConfigError(f"mode '{mode}' needs a synthetic workload name ({', '.join(_SYNTHETIC)}), not a trace")
    return Workload(name=name, prompts=prompts, max_length=max_length, mode=mode, seed=seed, source=source,
                    description=description or trace.source, trace=trace, _prompt_tokens=ptoks)


def parse_mode(mode: ReplayMode | str) -> ReplayMode:
    """`ReplayMode` from its value, with a message listing the choices."""
    try:
        return ReplayMode(mode)
    except ValueError:
        choices = ", ".join(m.value for m in ReplayMode)
        raise ConfigError(f"unknown replay mode {excerpt(mode)} (choose {choices})") from None


def named_trace_workload(spec: str | Path, *, mode: ReplayMode, seed: int, length_column: str | None = None,
                         prompt_column: str | None = None) -> Workload:
    """A trace-backed workload by bundled trace name or trace path (`workloads/names.py`'s `load_workload` resolves
    every other kind of name first)."""
    if isinstance(spec, str) and spec not in bundled_trace_names() and not Path(spec).exists():
        raise TraceError(f"no such trace {excerpt(spec)}: not a bundled workload "
                         f"({', '.join(bundled_workloads())}) and no such file")
    trace = require_tokens(load_trace(spec, length_column=length_column, prompt_column=prompt_column))
    bundled = isinstance(spec, str) and spec in _TRACE_DESCRIPTIONS
    name = str(spec) if bundled else Path(spec).stem
    cap = _TRACE_MAX_LENGTH.get(str(spec)) if bundled else None
    return trace_workload(trace, name=name, mode=mode, seed=seed, max_length=cap,
                          description=_TRACE_DESCRIPTIONS.get(str(spec), "") if bundled else str(spec))
