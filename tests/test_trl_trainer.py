"""`TailSieveGRPOTrainer` (integrations/trl/trainer.py): TRL's real trainer (loop, AdamW, GRPO loss) on the tiny
Llama with fake vLLM servers under the session: rewards see each completion with its own row (TailSieve's rows
replace TRL's sampled ones), the weights are pushed to every replica after every optimizer step, and a replica that
does not serve the pushed weights (the fake ignores them) is caught by the greedy probe in one line. Setups the
session cannot serve are refused at construction, each in one line. The real-server run is
tests/test_trl_integration.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine_fake import FakeServer
from tailsieve.engines.rollout.api import RolloutConfig
from tailsieve.engines.transport.engine_client import SamplingParams
from tailsieve.integrations.trl.session import TrlIntegrationError, TrlSession
from vllm_fixtures import tiny_model  # noqa: F401

pytestmark = [pytest.mark.extra("trl", "torch", "transformers"), pytest.mark.timeout(600)]

ROWS = [{"prompt": f"row {i}: the model sums {i}", "answer": str(i), "meta": {"row": i, "prompt": f"row {i}: the "
         f"model sums {i}"}} for i in range(24)]


class RowCheck:
    """A reward that records whether each completion's row names the prompt TRL gave it."""

    __name__ = "row_check"

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.mismatches = 0

    def __call__(self, prompts: list[str], completions: list[str], meta: list[dict[str, Any]], **_: Any) -> list[float]:
        self.rows += [m["row"] for m in meta]
        self.mismatches += sum(m["prompt"] != p for m, p in zip(meta, prompts, strict=True))
        return [float(len(c) % 3) for c in completions]


@pytest.fixture
def servers() -> Iterator[list[FakeServer]]:
    with FakeServer() as a, FakeServer() as b:
        yield [a, b]


def build(tiny: Path, servers: list[FakeServer], tmp_path: Path, *, probe: bool = True, groups: int = 2,
          **args: Any) -> Any:
    import torch
    import transformers as tf
    from datasets import Dataset
    from trl import GRPOConfig

    from tailsieve.integrations.trl.trainer import TailSieveGRPOTrainer

    config = RolloutConfig(groups=groups, group_size=4, rho=0.5, policy="static", q=1, m=1, seed=None,
                           sampling=SamplingParams(max_tokens=12))
    session = TrlSession([s.url for s in servers], config, ROWS, checkpoints=tmp_path / "ck")
    base = {"output_dir": str(tmp_path / "out"), "per_device_train_batch_size": 8, "num_generations": 4,
            "max_steps": 3, "max_completion_length": 12, "learning_rate": 1e-3, "logging_steps": 1,
            "report_to": [], "use_cpu": True, "save_strategy": "no", "beta": 0.0, "disable_tqdm": True}
    model = tf.AutoModelForCausalLM.from_pretrained(str(tiny), dtype=torch.float32)
    reward = RowCheck()
    trainer = TailSieveGRPOTrainer(model=model, reward_funcs=reward, args=GRPOConfig(**(base | args)),
                                   train_dataset=Dataset.from_list(ROWS), eval_dataset=Dataset.from_list(ROWS[:8]),
                                   processing_class=tf.AutoTokenizer
                                   .from_pretrained(str(tiny)), session=session, probe=probe)
    return trainer, reward, session


def test_trl_trains_on_tailsieve_rows_and_pushes_every_step(tiny_model: Path, servers: list[FakeServer],  # noqa: F811
                                                            tmp_path: Path) -> None:
    trainer, reward, session = build(tiny_model, servers, tmp_path, probe=False)
    try:
        trainer.train()
    finally:
        session.close()
    assert reward.mismatches == 0 and len(reward.rows) == 3 * 8
    consumed = [r for h in session.history for r in h.consumed_rows]
    assert reward.rows == [r for r in consumed for _ in range(4)]  # the rewards saw TailSieve's rows, in order
    assert any(h.requested_rows != h.consumed_rows for h in session.history)  # ... not TRL's sampled ones
    assert [p.step for p in trainer.pushes] == [1, 2, 3] and [p.weight_version for p in trainer.pushes] == [1, 2, 3]
    assert all(len(s.reloads) == 3 for s in servers)  # every replica reloaded after every optimizer step
    assert [h.weight_version for h in session.history] == [0, 1, 2]
    logged = [e for e in trainer.state.log_history if "reward" in e]
    assert [e["tailsieve/weight_version"] for e in logged] == [0.0, 1.0, 2.0]
    assert all(e["tailsieve/stale_samples"] == 0.0 for e in logged)


def test_a_replica_not_serving_the_pushed_weights_stops_training(tiny_model: Path,  # noqa: F811
                                                                 servers: list[FakeServer], tmp_path: Path) -> None:
    trainer, _, session = build(tiny_model, servers, tmp_path)
    try:
        with pytest.raises(TrlIntegrationError) as err:
            trainer.train()
    finally:
        session.close()
    assert str(err.value) == ("after step 1 replica(s) [0, 1] do not serve the trainer's weights (greedy probe, "
                              "version 1)")


@pytest.mark.parametrize(("kw", "message"), [
    ({"num_generations": 2}, "num_generations (2) must equal the session's group_size (4)"),
    ({"groups": 3}, "generation_batch_size (8) must be groups × group_size = 3 × 4 = 12"),
    ({"eval_strategy": "steps", "eval_steps": 1}, "eval_strategy must be 'no': evaluation through TailSieve is not "
                                                  "supported"),
])
def test_setups_the_session_cannot_serve_are_refused(tiny_model: Path, servers: list[FakeServer],  # noqa: F811
                                                     tmp_path: Path, kw: dict[str, Any], message: str) -> None:
    with pytest.raises(TrlIntegrationError) as err:
        build(tiny_model, servers, tmp_path, **kw)
    assert str(err.value) == message
    assert all(s.started == 0 for s in servers)
