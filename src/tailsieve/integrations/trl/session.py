"""`TrlSession`: a TailSieve `Rollout` over a TRL training dataset, driven from TRL's synchronous trainer.

The session owns the prompt order (TailSieve's stream over the dataset rows, like slime's data source): every row is
a prompt whose id is its row index, and a step returns N complete groups of G, some of them groups cut at an earlier
step and regenerated now on the tail pool. `step(slots)` runs one TailSieve step and hands back, per consumed sample,
a copy of the sample's **own dataset row** (answer, metadata, …) and TRL's rollout output (prompt ids, completion
ids, per-token logprobs), so the trainer computes every reward on the prompt it was generated for. `push(model)`
saves the trainer's weights as a checkpoint and reloads them on every replica in place (`Rollout.update_weights`);
`probe(model)` asks every replica for the greedy tokens of a fixed prompt and checks them against the trainer's own
logits (`probe.greedy_agreement`).

TRL's trainer is synchronous and runs no event loop; the session keeps one private event loop and runs each
coroutine on it to completion (the HTTP session stays bound to that loop between calls).
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import time
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from tailsieve.engines.rollout.api import Batch, RolloutConfig
from tailsieve.engines.rollout.peer_rollout import make_rollout
from tailsieve.engines.rollout.prompts import PromptRecord
from tailsieve.engines.rollout.weight_sync import WeightUpdate
from tailsieve.engines.transport.engine_client import ClientOptions, Endpoint, EngineClient, Request, SamplingParams
from tailsieve.errors import TailSieveError
from tailsieve.integrations.trl.probe import ProbeResult, greedy_agreement
from tailsieve.outputs import OutputLock
from tailsieve.policy.controller_knobs import controller_from_mapping
from tailsieve.policy.step import GroupStatus

__all__ = ["PendingStep", "PushRecord", "StepStats", "TrlIntegrationError", "TrlSession"]

T = TypeVar("T")
PROBE_PROMPT = "the model sums 3 and 9"


class TrlIntegrationError(TailSieveError):
    """A TRL setup TailSieve cannot serve, or a rollout that does not fit TRL's batch (one line)."""


@dataclass(frozen=True, slots=True)
class StepStats:
    """One TailSieve step behind one TRL generation: what the closing-note table reports."""

    step: int
    weight_version: int
    stale_samples: int
    carried_in: int  # consumed groups that were cut at an earlier step (carried, regenerated from scratch)
    cut: int  # groups cut at this step's cutoff, carried to the next
    rollout_s: float
    requested_rows: tuple[int, ...]  # the rows TRL's sampler picked (one per group)
    consumed_rows: tuple[int, ...]  # the rows TailSieve consumed (one per group, tail pool first)


@dataclass(frozen=True, slots=True)
class PushRecord:
    """One weight push after optimizer step `step`: the version now served, how, its seconds, the probe."""

    step: int
    weight_version: int
    methods: tuple[str, ...]
    seconds: float
    probe: ProbeResult | None


@dataclass(frozen=True, slots=True)
class PendingStep:
    """A step's output waiting for TRL: the consumed rows (each repeated G times) and TRL's rollout dict."""

    rows: tuple[dict[str, Any], ...]
    prompt_ids: tuple[tuple[int, ...], ...]
    completion_ids: tuple[tuple[int, ...], ...]
    logprobs: tuple[tuple[float, ...], ...]
    stats: StepStats

    def output(self) -> dict[str, Any]:
        """The dict TRL's `rollout_func` returns (lists, as TRL pads them)."""
        return {"prompt_ids": [list(x) for x in self.prompt_ids],
                "completion_ids": [list(x) for x in self.completion_ids],
                "logprobs": [list(x) for x in self.logprobs]}


class TrlSession:
    """TailSieve steps over `dataset` on `endpoints` (see the module docstring); `close()` when done."""

    def __init__(self, endpoints: Sequence[str | Endpoint], config: RolloutConfig, dataset: Sequence[Mapping[str, Any]],
                 *, checkpoints: str | Path, prompt_key: str = "prompt", tokenizer: Any = None,
                 controller: Mapping[str, Any] | None = None) -> None:
        try:  # any `ControllerConfig` field by name, over `config.controller` (`controller_from_mapping`)
            ctl = controller_from_mapping(controller, "TrlSession controller", config.controller)
        except TailSieveError as exc:
            raise TrlIntegrationError(str(exc)) from None
        self.config = dataclasses.replace(config, logprobs=True, controller=ctl)
        self.dataset = dataset
        self.prompt_key = prompt_key
        self.checkpoints = Path(checkpoints)
        records = tuple(PromptRecord(str(i), self._render(row, i, tokenizer)) for i, row in enumerate(dataset))
        if not records:
            raise TrlIntegrationError("the training dataset is empty")
        self._index: dict[str, int] = {}  # a row's prompt → its first row index (to record TRL's sampled rows)
        for i, row in enumerate(dataset):
            self._index.setdefault(repr(row[prompt_key]), i)
        self._loop = asyncio.new_event_loop()
        self.rollout = make_rollout(endpoints, self.config, records)
        self.history: list[StepStats] = []
        self.updates: list[WeightUpdate] = []
        self.probes: list[ProbeResult] = []
        self._last_checkpoint: Path | None = None
        self._lock: OutputLock | None = None  # on `checkpoints`, from the first push to `close()`
        self._open = False

    def _render(self, row: Mapping[str, Any], i: int, tokenizer: Any) -> str:
        if self.prompt_key not in row:
            raise TrlIntegrationError(f"dataset row {i} has no '{self.prompt_key}' column")
        prompt = row[self.prompt_key]
        if isinstance(prompt, str):
            return prompt
        if tokenizer is None:
            raise TrlIntegrationError(f"dataset row {i}: a conversational prompt needs the tokenizer (chat template)")
        return str(tokenizer.apply_chat_template(list(prompt), tokenize=False, add_generation_prompt=True))

    @property
    def group_size(self) -> int:
        return self.rollout.rc.group_size

    @property
    def groups(self) -> int:
        return self.rollout.rc.groups

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the session's loop (from TRL's thread, which runs no loop of its own)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self._loop.run_until_complete(coro)
        coro.close()
        raise TrlIntegrationError("TrlSession is synchronous: call it from a thread without a running event loop")

    def open(self) -> TrlSession:
        """Open the HTTP session and health-check every replica (idempotent)."""
        if not self._open:
            self.run(self.rollout.open())
            self._open = True
        return self

    def close(self) -> None:
        """Close the HTTP session and the loop."""
        if self._open:
            self.run(self.rollout.close())
            self._open = False
        if not self._loop.is_closed():
            self._loop.close()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def step(self, requested: Sequence[Mapping[str, Any]] = ()) -> PendingStep:
        """One TailSieve step: N complete groups, each sample with its own dataset row. `requested` (TRL's sampled
        inputs, G per group) must hold N × G rows; they are recorded, not generated (TailSieve draws the prompts)."""
        n, g = self.groups, self.group_size
        if requested and len(requested) != n * g:
            raise TrlIntegrationError(f"TRL asked for {len(requested)} completions but the TailSieve session makes "
                                      f"{n} groups of {g} = {n * g} per step (set generation_batch_size = {n * g})")
        self.open()
        t0 = time.perf_counter()
        batch = self.run(self.rollout.step())
        stats = self._stats(batch, requested, time.perf_counter() - t0)
        pending = self._pending(batch, stats)
        self.history.append(stats)
        return pending

    def _stats(self, batch: Batch, requested: Sequence[Mapping[str, Any]], seconds: float) -> StepStats:
        asked = tuple(self._row_of(r) for r in requested[::self.group_size])
        return StepStats(batch.step, batch.weight_version, batch.stale_samples, sum(c > 0 for c in batch.redraws),
                         sum(o.status is GroupStatus.ABORTED for o in batch.outcomes), seconds, asked,
                         tuple(int(grp.prompt_id) for grp in batch.groups))

    def _row_of(self, row: Mapping[str, Any]) -> int:
        """The dataset index of a row TRL sampled (its prompt's first occurrence), -1 when not found."""
        return self._index.get(repr(row.get(self.prompt_key)), -1)

    def _pending(self, batch: Batch, stats: StepStats) -> PendingStep:
        rows: list[dict[str, Any]] = []
        prompts: list[tuple[int, ...]] = []
        completions: list[tuple[int, ...]] = []
        logprobs: list[tuple[float, ...]] = []
        for s in batch.trainer_samples():
            if s.prompt_token_ids is None or s.response_token_ids is None or s.logprobs is None:
                raise TrlIntegrationError(f"replica answer for prompt {s.prompt_id} lacks token ids or logprobs "
                                          "(TRL needs both: a vLLM server returns them with return_token_ids)")
            rows.append(dict(self.dataset[int(s.prompt_id)]))
            prompts.append(s.prompt_token_ids)
            completions.append(s.response_token_ids)
            logprobs.append(s.logprobs)
        return PendingStep(tuple(rows), tuple(prompts), tuple(completions), tuple(logprobs), stats)

    def push(self, model: Any, step: int) -> WeightUpdate:
        """Save `model` (a transformers model) as checkpoint `step` and reload it on every replica in place; the
        previous checkpoint folder is removed once the replicas serve the new one."""
        self.open()
        folder = self.checkpoints / f"step-{step:05d}"
        partial = folder.with_name(folder.name + ".partial")
        try:
            if self._lock is None:  # one session writes the checkpoints folder (held until `close()`)
                self.checkpoints.mkdir(parents=True, exist_ok=True)
                self._lock = OutputLock(self.checkpoints, "TRL session", folder=True, flag="checkpoints").acquire()
            shutil.rmtree(partial, ignore_errors=True)
            model.save_pretrained(str(partial), safe_serialization=True)
            partial.rename(folder)
        except (OSError, TailSieveError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise TrlIntegrationError(f"cannot write checkpoint {folder}: {why}; the replicas keep the previous "
                                      "weights") from None
        update = self.run(self.rollout.update_weights(folder))
        if self._last_checkpoint is not None:
            shutil.rmtree(self._last_checkpoint, ignore_errors=True)
        self._last_checkpoint = folder
        self.updates.append(update)
        return update

    def probe(self, model: Any, *, prompt: str = PROBE_PROMPT, tokens: int = 8) -> ProbeResult:
        """Every replica's greedy tokens for `prompt`, checked against `model`'s own logits."""
        result = greedy_agreement(model, self.greedy(prompt, tokens), self.rollout.weight_version)
        self.probes.append(result)
        return result

    def greedy(self, prompt: str = PROBE_PROMPT, tokens: int = 8) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        """(prompt ids, greedy token ids) of `prompt` from every replica, in replica order."""
        self.open()
        return self.run(self._greedy(prompt, tokens))

    async def _greedy(self, prompt: str, tokens: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        params = SamplingParams(temperature=0.0, max_tokens=tokens)
        assert self.rollout.executor is not None  # open() resolved the served model
        model = self.rollout.executor.model
        out = []
        async with EngineClient(ClientOptions(stream=False)) as client:
            for i, ep in enumerate(self.rollout.endpoints):
                comp = await client.complete(ep, model, Request(f"probe-{i}", prompt), params)
                choice = comp.choices[0]
                if choice.token_ids is None or choice.prompt_token_ids is None:
                    raise TrlIntegrationError(f"{ep.url}: the greedy probe needs the server's token ids (vLLM)")
                out.append((choice.prompt_token_ids, choice.token_ids))
        return out
