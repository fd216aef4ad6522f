"""`TailSieveGRPOTrainer`: TRL's `GRPOTrainer` with its generations served by a TailSieve step.

TRL's extension point is `rollout_func(prompts, trainer) -> {"prompt_ids", "completion_ids", "logprobs"}`, called
with the prompts of the rows TRL's sampler picked. A TailSieve step does not answer those rows: it consumes N complete
groups from its own prompt stream, some of them cut at an earlier step and regenerated now. So the trainer overrides
one method, `_generate_and_score_completions(inputs)`: it runs the step first (`TrlSession.step`), replaces TRL's
sampled rows with the rows TailSieve consumed (each its own dataset row: answer, metadata, …, G times), and lets TRL's
own code go on; TRL then calls `rollout_func`, which returns that step's token ids and logprobs. Rewards, advantages,
the loss, the optimizer and logging are TRL's, unchanged, and see every completion next to its own prompt and row.

After every optimizer step (`on_step_end`) the `PushWeights` callback saves the model and reloads it on every replica
in place, then (with `probe=True`) checks with the greedy probe that each replica serves the new weights. Every
step's TailSieve numbers go into TRL's logs as `tailsieve/*` metrics.
"""

from __future__ import annotations

import time
from typing import Any

from transformers import TrainerCallback
from trl import GRPOTrainer

from tailsieve.integrations.trl.session import PendingStep, PushRecord, StepStats, TrlIntegrationError, TrlSession

__all__ = ["PushWeights", "TailSieveGRPOTrainer", "check_setup"]


def check_setup(args: Any, num_generations: int, session: TrlSession, processes: int) -> None:
    """The TRL settings a TailSieve session can serve; each other one is a one-line `TrlIntegrationError`."""
    n, g = session.groups, session.group_size
    if processes != 1:
        raise TrlIntegrationError(f"TailSieve's TRL trainer runs in one process (got {processes}): the session "
                                  "serves the whole generation batch")
    if num_generations != g:
        raise TrlIntegrationError(f"num_generations ({num_generations}) must equal the session's group_size ({g})")
    if args.generation_batch_size != n * g:
        raise TrlIntegrationError(f"generation_batch_size ({args.generation_batch_size}) must be groups × "
                                  f"group_size = {n} × {g} = {n * g}")
    if getattr(args, "use_vllm", False):
        raise TrlIntegrationError("use_vllm must be False: TailSieve serves the generations from its own replicas")
    strategy = getattr(args, "eval_strategy", "no")
    if getattr(strategy, "value", strategy) != "no":
        raise TrlIntegrationError("eval_strategy must be 'no': evaluation through TailSieve is not supported")


class TailSieveGRPOTrainer(GRPOTrainer):  # type: ignore[misc]  # TRL's types are not followed (pyproject)
    """`GRPOTrainer(..., session=TrlSession(...))`; every other argument is TRL's (see the module docstring)."""

    def __init__(self, *args: Any, session: TrlSession, probe: bool = True, **kwargs: Any) -> None:
        if kwargs.get("rollout_func") is not None:
            raise TrlIntegrationError("rollout_func is TailSieve's in TailSieveGRPOTrainer: do not pass one")
        self.session = session
        self.pushes: list[PushRecord] = []
        self._pending: PendingStep | None = None
        super().__init__(*args, rollout_func=self._rollout, **kwargs)
        if len(self.train_dataset) != len(session.dataset):
            raise TrlIntegrationError(f"the trainer's dataset has {len(self.train_dataset)} rows, the session's "
                                      f"{len(session.dataset)}: pass the same dataset to both")
        check_setup(self.args, self.num_generations, session, self.accelerator.num_processes)
        self.add_callback(PushWeights(self, probe=probe))

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        if not self.model.training:
            raise TrlIntegrationError("evaluation through TailSieve is not supported (eval_strategy='no')")
        self._pending = self.session.step(inputs)
        self._log_stats(self._pending.stats)
        out: dict[str, Any] = super()._generate_and_score_completions([dict(r) for r in self._pending.rows])
        return out

    def _rollout(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        """TRL's `rollout_func`: the pending step's ids and logprobs, for exactly the rows it consumed."""
        pending, self._pending = self._pending, None
        if pending is None:
            raise TrlIntegrationError("rollout_func called outside a TailSieve step")
        key = self.session.prompt_key
        if list(prompts) != [r[key] for r in pending.rows]:
            raise TrlIntegrationError("TRL's prompts are not the rows the TailSieve step consumed")
        return pending.output()

    def _log_stats(self, s: StepStats) -> None:
        m = self._metrics["train"]
        for name, value in (("stale_samples", s.stale_samples), ("carried_in", s.carried_in), ("cut", s.cut),
                            ("weight_version", s.weight_version), ("rollout_s", s.rollout_s)):
            m[f"tailsieve/{name}"].append(float(value))


class PushWeights(TrainerCallback):  # type: ignore[misc]
    """After every optimizer step: the trainer's weights to every replica (in place), then the greedy probe."""

    def __init__(self, trainer: TailSieveGRPOTrainer, *, probe: bool = True) -> None:
        self.trainer = trainer
        self.probe = probe

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        trainer = self.trainer
        model = trainer.accelerator.unwrap_model(trainer.model)
        t0 = time.perf_counter()
        update = trainer.session.push(model, int(state.global_step))
        seconds = time.perf_counter() - t0
        result = trainer.session.probe(model) if self.probe else None
        if result is not None and result.stale:
            raise TrlIntegrationError(f"after step {state.global_step} replica(s) {list(result.stale)} do not serve "
                                      f"the trainer's weights (greedy probe, version {update.version})")
        trainer.pushes.append(PushRecord(int(state.global_step), update.version,
                                         tuple(m.value for m in update.methods), seconds, result))
