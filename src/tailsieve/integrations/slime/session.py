"""One slime job's TailSieve session: the step loop (router + controller), the SGLang workers behind the
`sglang-native` backend, and a background event loop, kept across `generate_rollout` calls.

Each training rollout is one TailSieve step. The router draws by *draw index* over slime's dataset order (a
one-entry prompt stream, so a draw's `uid` is its position in the sequence of groups taken from the data source):
a planned group not in the carry list is fetched with `data_source.get_samples(k)`, all missing ones at once, and
stays in the carry list until it is consumed. Cut groups are regenerated from scratch (new request ids and
seeds), and the N complete groups come back as slime samples: `tokens` = prompt + response ids, `response_length`,
`rollout_log_probs`, `weight_versions` (the version the worker reported with the sample, else the rollout id),
`rollout_top_p_token_ids` / `_offsets` (with `--rollout-top-p` < 1), `status`, and `metadata["tailsieve"]` (draw
index, pool, step, cuts, replica, attempts, weight version). The carry state advances only when a step completes,
so a failed step loses nothing.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from tailsieve.engines import TokenPrompt
from tailsieve.engines.rollout.engine_executor import EngineExecutor, ExecutedStep, GroupSpec, RequestMode, Sample
from tailsieve.engines.transport.engine_client import ClientOptions, Endpoint, EngineClient, NoHealthyReplica
from tailsieve.engines.transport.health import FaultPolicy, Replicas
from tailsieve.hashing import stable_hash
from tailsieve.integrations.slime.data_source import CarryState
from tailsieve.integrations.slime.sample import status_for
from tailsieve.integrations.slime.settings import SlimeIntegrationError, SlimeSettings, sampling_params
from tailsieve.loop import LoopState, build_loop
from tailsieve.policy.step import GroupOutcome, GroupRef, StepPlan

__all__ = ["Session"]

T = TypeVar("T")
_STREAM = ("slime",)  # one stream entry: a draw's uid is its index in the data source's order
Fetch = Callable[[int], list[list[Any]]]
Accept = Callable[[list[list[Any]]], None]  # runs on the finished batch before the state moves (slime: rewards)


class Session:
    """See the module docstring; `close()` ends the background loop and the HTTP session."""

    def __init__(self, args: Any, settings: SlimeSettings, endpoints: Sequence[Endpoint]) -> None:
        self.args, self.settings, self.endpoints = args, settings, tuple(endpoints)
        spec = settings.spec(len(endpoints))
        self.rc = spec.router
        self.steps = build_loop(spec, _STREAM)  # the same assembly as `simulate` and `Rollout`
        self.router, self.controller = self.steps.router, self.steps.controller
        self.params = sampling_params(args)
        self.client = EngineClient(ClientOptions(stream=settings.stream, logprobs=True, api_key_env=None))
        self.executor: EngineExecutor | None = None
        self.tokenizer: Any = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tailsieve-slime", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the session's loop and wait for it (callable from any non-loop thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def shape(self) -> dict[str, Any]:
        """What a saved state must match."""
        return {"groups": self.rc.groups, "group_size": self.rc.group_size, "replicas": self.rc.replicas,
                "policy": self.settings.policy}

    async def _open(self) -> EngineExecutor:
        self.client.open()
        replicas = Replicas(self.endpoints, self.client, FaultPolicy())
        await replicas.check_all()
        if not replicas.healthy():
            await replicas.close()
            raise NoHealthyReplica(f"no SGLang worker answers /health: {', '.join(e.url for e in self.endpoints)}")
        return EngineExecutor(replicas, "default", self.params, self.rc.group_size, RequestMode.SPLIT)

    def open(self) -> EngineExecutor:
        """Health-check the workers once and build the executor."""
        if self.executor is None:
            self.executor = self.run(self._open())
        return self.executor

    def close(self) -> None:
        """Close the HTTP session and stop the background loop."""
        if self._loop.is_closed():
            return

        async def shut() -> None:
            if self.executor is not None:
                await self.executor.replicas.close()
            await self.client.close()

        self.run(shut())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def step(self, state: CarryState, fetch: Fetch, rollout_id: int,
             accept: Accept | None = None) -> tuple[list[list[Any]], dict[str, Any]]:
        """One TailSieve step: N complete groups of slime samples and the step's metrics. `state` (router,
        controller, carry list) advances only once the batch is accepted: every group converted and `accept`
        (the rewards) done without error; until then the carried prompt samples are left untouched (the batch is
        built on copies), so a failed step runs again, with the same draws, on the next call."""
        if state.loop is not None and state.shape and state.shape != self.shape():
            raise SlimeIntegrationError(f"saved TailSieve state is for {state.shape}, this job is {self.shape()}")
        executor = self.open()
        executor.weight_version = int(rollout_id)
        before = state.loop or LoopState(self.router.initial_state(), self.controller.initial())
        plan = self.steps.plan(before)
        self._fill(plan, state, fetch)
        result = self.run(executor.execute(plan, lambda ref: self._spec(ref, state.carry[ref.uid])))
        out = self.steps.complete(before, plan, result, 0.0)
        assert isinstance(result, ExecutedStep)
        groups = [self._finish(o, result.samples[o.ref.uid], copy.deepcopy(state.carry[o.ref.uid]), plan.step)
                  for o in out.consumed]
        if accept is not None:
            accept(groups)
        for o in out.consumed:
            del state.carry[o.ref.uid]
        state.loop, state.shape = out.state, self.shape()
        metrics = {"tailsieve/q": plan.q, "tailsieve/m": plan.m, "tailsieve/makespan_s": out.record.makespan_s,
                   "tailsieve/wasted_tokens": out.record.wasted_tokens, "tailsieve/carried": len(state.carry),
                   "tailsieve/redispatched": result.redispatched}
        return groups, metrics

    def _fill(self, plan: StepPlan, state: CarryState, fetch: Fetch) -> None:
        """Fetch the plan's fresh draws (missing from the carry list) from the data source, in draw order."""
        missing = sorted(r.uid for r in (*plan.tail, *plan.bulk) if r.uid not in state.carry)
        if not missing:
            return
        groups = list(fetch(len(missing)))
        if len(groups) != len(missing):
            raise SlimeIntegrationError(f"the data source returned {len(groups)} groups, {len(missing)} asked")
        for uid, group in zip(missing, groups, strict=True):
            if len(group) != self.rc.group_size:
                raise SlimeIntegrationError(f"a data source group has {len(group)} samples, "
                                            f"n_samples_per_prompt is {self.rc.group_size}")
            state.carry[uid] = list(group)

    def prompt_ids(self, sample: Any) -> list[int] | None:
        """A prompt's token ids: the sample's `tokens`, else the job's tokenizer (`args.hf_checkpoint`), else None
        (the prompt goes as text)."""
        if sample.tokens:
            return [int(t) for t in sample.tokens]
        path = getattr(self.args, "hf_checkpoint", None)
        if not path or not isinstance(sample.prompt, str):
            return None
        if self.tokenizer is None:
            try:
                transformers: Any = importlib.import_module("transformers")
            except ImportError:
                return None
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(path, trust_remote_code=True)
        return [int(t) for t in self.tokenizer.encode(sample.prompt, add_special_tokens=False)]

    def _spec(self, ref: GroupRef, group: list[Any]) -> GroupSpec:
        """What to send for a group: its prompt (token ids when known) and fresh seeds for this draw attempt."""
        first = group[0]
        text = first.prompt if isinstance(first.prompt, str) else "\n\n".join(m["content"] for m in first.prompt)
        ids = self.prompt_ids(first)
        g = self.rc.group_size
        seeds: tuple[int | None, ...] = (None,) * g
        if self.settings.seed is not None:
            h = stable_hash(f"{self.settings.seed}|{ref.uid}|{ref.cuts}")
            seeds = tuple(int((h + j * 0x9E3779B1) % (2**31 - 1)) for j in range(g))
        return GroupSpec(text if ids is None else TokenPrompt(ids, text), seeds, (None,) * g)

    def _top_p(self, out: Any, s: Sample, uid: int, j: int) -> None:
        """With `--rollout-top-p` < 1, the top-p kept token ids slime asserts on every sample (ids and offsets,
        one offset per response token and one more); a server that returned none is a one-line error."""
        if self.params.top_p == 1.0:
            return
        if s.top_p is None:
            raise SlimeIntegrationError(f"--rollout-top-p {self.params.top_p} < 1 needs the top-p kept token ids, "
                                        f"and {self.endpoints[s.replica].url} returned none for group {uid} member "
                                        f"{j} (it needs slime's SGLang patch, which answers custom_params "
                                        "return_top_p_token_ids)")
        out.rollout_top_p_token_ids = list(s.top_p.token_ids)
        out.rollout_top_p_token_offsets = list(s.top_p.offsets)

    def _finish(self, outcome: GroupOutcome, samples: Sequence[Sample | None], group: list[Any],
                step: int) -> list[Any]:
        """Fill a consumed group's slime samples from its generated members."""
        for j, (s, out) in enumerate(zip(samples, group, strict=True)):
            if s is None:
                raise SlimeIntegrationError(f"group {outcome.ref.uid} member {j} has no sample")
            prompt = list(s.prompt_token_ids) if s.prompt_token_ids is not None else list(out.tokens)
            response = list(s.token_ids) if s.token_ids is not None else []
            out.tokens = prompt + response
            out.response = s.text
            out.response_length = len(response) if s.token_ids is not None else s.tokens
            out.rollout_log_probs = None if s.logprobs is None else list(s.logprobs)
            out.weight_versions = [s.served_version or str(s.weight_version)]
            self._top_p(out, s, outcome.ref.uid, j)
            out.status = status_for(out, s.finish_reason)
            out.metadata = {**(out.metadata or {}), "tailsieve": {
                "uid": outcome.ref.uid, "pool": outcome.pool.value, "step": step, "cuts": outcome.ref.cuts,
                "replica": s.replica, "attempts": s.attempts, "weight_version": s.weight_version,
                "finish_reason": s.finish_reason}}
        return group
