"""`TailSieveTrainer`: verl's synchronous PPO trainer with TailSieve steps, registered as trainer mode `tailsieve`.

verl runs a step as `prepare_step()` → `replay_buffer.sample(...)` → `on_sample_end()`. Here:

- `prepare_step()` opens a TailSieve step (`StepSession.begin`: the router's plan at the controller's q and m) and
  submits every planned group: N + E fresh groups on the first step, then the q carried groups (tail pool, under new
  keys and request ids: regenerated from scratch) plus the fresh bulk groups. Each prompt carries its route.
- `TailSieveReplayBuffer.sample()` returns exactly the N groups the step keeps.
- `on_sample_end()` cuts the leftovers: tags their keys cut in TransferQueue (members not yet sent are never sent,
  see `TailSieveLLMServerClient.generate`), aborts their running requests on their servers, drops what they wrote,
  completes the step through the step loop (contract check, controller update) and then does verl's sync end of
  sampling. The aborts run on the trainer's own event-loop thread (`LoopThread`), so the hook works whether or not
  the calling thread already runs an event loop.

The client (`get_llm_client`) is `TailSieveLLMServerClient` over `LLMServerManager`'s servers in replica order, and
the prompts run the `tailsieve_single_turn` agent loop unless they name their own.
"""

from __future__ import annotations

from typing import Any

import transfer_queue as tq
from omegaconf import OmegaConf
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils import tensordict_utils as tu

from tailsieve.errors import ConfigError
from tailsieve.integrations.verl.agent_loop import AGENT_NAME
from tailsieve.integrations.verl.buffer import TailSieveReplayBuffer
from tailsieve.integrations.verl.client import TailSieveLLMServerClient
from tailsieve.integrations.verl.loop_thread import LoopThread
from tailsieve.integrations.verl.session import CUT_TAG, ROUTE_FIELD, Assignment, StepSession, TailSieveSettings
from tailsieve.loop import StepRecord

TRAINER_NAME = "tailsieve"
SAMPLER_PATH = "pkg://tailsieve.integrations.verl.buffer"
SAMPLER_NAME = "TailSieveReplayBuffer"
PARTITION = "train"


def settings_from_config(config: Any) -> TailSieveSettings:
    """`trainer.v1.tailsieve.*` as `TailSieveSettings`; ConfigError (one line) for a bad configuration."""
    v1 = config.trainer.v1
    if int(v1.get(TRAINER_NAME, {}).get("parameter_sync_step", 1)) != 1:
        raise ConfigError("trainer.v1.tailsieve.parameter_sync_step must be 1 (TailSieve cuts one batch per step)")
    raw: dict[str, Any] = dict(OmegaConf.to_container(v1.get(TRAINER_NAME, None) or OmegaConf.create({}),
                                                      resolve=True) or {})
    return TailSieveSettings.from_mapping({str(k): v for k, v in raw.items() if k != "parameter_sync_step"})


@register_trainer(TRAINER_NAME)
class TailSieveTrainer(PPOTrainerSync):  # type: ignore[misc]  # verl ships no type information
    """See the module docstring. verl signature: `TailSieveTrainer(config: DictConfig)`."""

    def __init__(self, config: Any) -> None:
        self.tailsieve = settings_from_config(config)
        super().__init__(config)
        if not isinstance(self.replay_buffer, TailSieveReplayBuffer):
            raise ConfigError(f"trainer.v1.trainer_mode={TRAINER_NAME} needs trainer.v1.sampler.custom_sampler."
                              f"path={SAMPLER_PATH} and name={SAMPLER_NAME}")
        self.session: StepSession | None = None
        self.llm_client: TailSieveLLMServerClient | None = None
        self._rows: dict[int, Any] = {}  # router uid → its prompt row (kept until the group is consumed)
        self._fresh: list[Any] = []  # prompt rows fetched from the dataloader, not yet drawn
        self._loop = LoopThread("tailsieve-trainer")  # runs the aborts (see the module docstring)
        self.tailsieve_last: StepRecord | None = None  # the last completed step's record

    def _setup(self) -> None:
        """verl's setup; for `rollout.name=vllm` its `LLMServerManager` builds `TailSieveVLLMReplica`s, whose
        servers abort a cut request for real (verl's own abort misses vLLM's internal ids, see `vllm_replica`)."""
        if self.config.actor_rollout_ref.rollout.name != "vllm":
            super()._setup()
            return
        from tailsieve.integrations.verl.vllm_replica import tailsieve_vllm_replicas  # imports vLLM

        with tailsieve_vllm_replicas():
            super()._setup()

    def get_llm_client(self) -> TailSieveLLMServerClient:
        """verl's hook: the TailSieve client over the manager's servers, replica i = server i."""
        manager = self.llm_server_manager
        servers = list(zip(manager.server_addresses, manager.server_handles, strict=True))
        client: TailSieveLLMServerClient = manager.get_client(client_cls=TailSieveLLMServerClient, servers=servers,
                                                                       tq_partition=PARTITION)
        self.llm_client = client
        return client

    def tailsieve_session(self) -> StepSession:
        """The step session, built on first use: N = data.train_batch_size, G = rollout.n, R = rollout servers."""
        if self.session is None:
            n = int(self.config.data.train_batch_size)
            g = int(self.config.actor_rollout_ref.rollout.n)
            replicas = len(self.llm_server_manager.server_addresses)
            prompts = [str(i) for i in range(len(self.train_dataset))]
            self.session = StepSession(self.tailsieve.loop(n, g, replicas, prompts))
            self.replay_buffer.attach(self.session, self.tailsieve.poll_s)
        return self.session

    def _row(self, a: Assignment) -> Any:
        """The prompt row of a planned group: a carried group's own row, else the next dataloader row."""
        if a.ref.uid not in self._rows:
            if not self._fresh:
                chunk = self._fetch_one_gen_batch()
                self._fresh = [tu.index_select_tensor_dict(chunk, [i]) for i in range(len(chunk))]
            self._rows[a.ref.uid] = self._fresh.pop(0)
        return self._rows[a.ref.uid]

    def prepare_step(self) -> dict[str, Any]:
        """Open the step and submit every planned group (fresh and carried) with its key and route."""
        assignments = self.tailsieve_session().begin()
        batch = tu.concat_tensordict([self._row(a) for a in assignments])
        tu.assign_non_tensor_stack(batch, "uid", [a.key for a in assignments])
        tu.assign_non_tensor_stack(batch, ROUTE_FIELD, [a.route for a in assignments])
        if "agent_name" not in batch.keys():  # noqa: SIM118  # a TensorDict
            tu.assign_non_tensor_stack(batch, "agent_name", [AGENT_NAME] * len(assignments))
        tu.assign_non_tensor_data(batch, "global_steps", self.global_steps)
        self._submit_batch_to_rollout(batch)
        return {"tailsieve/submitted_groups": len(assignments),
                "tailsieve/regenerated_groups": sum(a.attempt > 0 for a in assignments)}

    def cut_leftovers(self) -> int:
        """Cut the open step's leftovers: tag their keys cut (unsent members are never sent), then abort their
        requests on their planned servers; returns how many a server reported aborted."""
        session = self.tailsieve_session()
        client = self.llm_client or self.get_llm_client()
        left = session.leftovers()
        if not left:
            return 0
        keys = [a.key for a in left]
        client.cut(keys)
        tq.kv_batch_put(keys=keys, partition_id=PARTITION, tags=[{CUT_TAG: True} for _ in keys])
        replicas = {rid: r for a in left for rid, r in zip(a.request_ids, a.replicas, strict=True)}
        aborted: int = self._loop.run(client.abort(list(replicas), replicas), timeout_s=self.tailsieve.abort_timeout_s)
        return aborted

    def on_sample_end(self) -> None:
        """Cut and drop the leftovers, complete the TailSieve step, then verl's sync end of sampling."""
        session = self.tailsieve_session()
        if session.plan is not None:
            self.cut_leftovers()
            keys = [a.key for a in session.leftovers()]
            self.replay_buffer.discard(keys, PARTITION, timeout_s=self.tailsieve.abort_timeout_s)
            for a in session.kept():
                self._rows.pop(a.ref.uid, None)
            self.tailsieve_last = session.finish().record
        super().on_sample_end()

    def _reissue_inflight_prompts(self, partition_id: str = PARTITION) -> int:
        """verl re-issues checkpointed in-flight prompts under their old keys for every trainer mode but `sync`.
        TailSieve's step session starts afresh at `fit()` (new keys from step 0 would collide with the restored
        ones, and a restored group is regenerated from scratch anyway), so whatever was restored in the partition
        is dropped instead; returns 0 (nothing re-issued)."""
        listing = tq.kv_list(partition_id) or {}
        stale = list(listing.get(partition_id, {}))
        if stale:
            tq.kv_clear(keys=stale, partition_id=partition_id)
        return 0

    def on_train_end(self) -> None:
        """verl's end of training; stops the trainer's event-loop thread."""
        super().on_train_end()
        self._loop.close()
