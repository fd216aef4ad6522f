"""Weight updates on two REAL vLLM CPU servers (tiny local Llama, development-mode endpoints on): a greedy prompt's
output changes after `Rollout.update_weights` and comes back when the old weights return; every consumed sample of
step t carries version t with its token ids and logprobs; the restart fallback (`LocalLauncher.reload`) serves the
same weights as the in-place reload."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from conftest import require_extra
from tailsieve.engines.launch import LocalLauncher
from tailsieve.engines.launch.tiny_vllm import tiny_launch_config
from tailsieve.engines.rollout.api import Rollout, RolloutConfig
from tailsieve.engines.rollout.prompts import PromptRecord
from tailsieve.engines.rollout.weight_sync import UpdateMethod
from tailsieve.engines.transport.engine_client import ClientOptions, Endpoint, EngineClient, Request, SamplingParams
from tailsieve.policy.controller import ControllerConfig
from vllm_fixtures import requires_vllm, tiny_model  # noqa: F401

pytestmark = [pytest.mark.real_server, pytest.mark.slow, requires_vllm, pytest.mark.timeout(600)]

PROMPTS = tuple(PromptRecord(f"p{i}", f"the model sums {i} and {i * 3}") for i in range(30))
GREEDY = SamplingParams(temperature=0.0, max_tokens=12)


@pytest.fixture(scope="module")
def reloadable(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalLauncher]:  # noqa: F811
    la = LocalLauncher(tiny_launch_config(tiny_model, max_num_seqs=64, weight_reload=True),
                       tmp_path_factory.mktemp("vllm-weights"))
    try:
        yield la.start()
    finally:
        la.stop()


@pytest.fixture(scope="module")
def perturbed(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    """The tiny model with every weight moved by Gaussian noise, saved like a trainer's checkpoint."""
    require_extra("torch", "transformers")
    import torch
    import transformers as tf
    out = tmp_path_factory.mktemp("ckpt-1")
    model = tf.AutoModelForCausalLM.from_pretrained(str(tiny_model))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen).to(p.dtype) * 0.5)
    model.save_pretrained(str(out), safe_serialization=True)
    return out


async def greedy(url: str) -> tuple[int, ...]:
    async with EngineClient(ClientOptions(stream=False)) as c:
        comp = await c.complete(Endpoint(url), "tiny", Request("greedy", "the model sums 3 and 9"), GREEDY)
        assert comp.choices[0].token_ids is not None
        return comp.choices[0].token_ids


def test_update_changes_greedy_output_and_versions_every_step(reloadable: LocalLauncher, perturbed: Path,
                                                              tiny_model: Path) -> None:  # noqa: F811
    urls = reloadable.endpoints
    # start in a split: the first step is the warm-up that cuts, so cut groups are regenerated across the updates
    # (from the uniform boundary the controller, pricing two CPU replicas honestly, may stay there)
    cfg = RolloutConfig(groups=4, group_size=4, rho=0.5, policy="tailsieve", logprobs=True,
                        sampling=SamplingParams(max_tokens=24), controller=ControllerConfig(m0=1))

    async def run() -> dict[str, Any]:
        out: dict[str, Any] = {"before": [await greedy(u) for u in urls], "versions": [], "carried": 0}
        async with Rollout(urls, cfg, PROMPTS) as r:
            for t, ckpt in enumerate((perturbed, tiny_model, perturbed)):
                b = await r.step()
                out["versions"].append({s.weight_version for g in b.groups for s in g.samples})
                out["carried"] += sum(c > 0 for c in b.redraws)  # groups cut before: regenerated, not resumed
                assert b.weight_version == t and b.stale_samples == 0
                for x in b.trainer_samples():
                    assert x.response_token_ids and x.logprobs and x.prompt_token_ids
                    assert len(x.logprobs) == len(x.response_token_ids)
                    assert all(lp <= 0.0 for lp in x.logprobs)
                up = await r.update_weights(ckpt)
                assert up.methods == (UpdateMethod.IN_PLACE, UpdateMethod.IN_PLACE)
                assert up.reported == (str(t + 1),) * 2  # read back from vLLM's GET /weight_info
                out.setdefault("after", []).append([await greedy(u) for u in urls])
        return out

    out = asyncio.run(run())
    assert out["versions"] == [{0}, {1}, {2}]
    assert out["carried"] > 0  # some consumed groups were carried over an update and still carry the new version
    before, (new, back, new_again) = out["before"], out["after"]
    assert before[0] == before[1] and new[0] == new[1]
    assert new[0] != before[0]  # the perturbed weights answer differently ...
    assert back == before  # ... and the original checkpoint brings the original answer back
    assert new_again == new


def test_restart_fallback_serves_the_same_weights(reloadable: LocalLauncher, perturbed: Path) -> None:
    urls = reloadable.endpoints
    in_place = asyncio.run(greedy(urls[1]))  # replica 1 holds `perturbed` after the previous test
    spent = reloadable.reload(str(perturbed), [0])
    assert spent > 0 and reloadable.slots[0].restarts == 1
    assert asyncio.run(greedy(urls[0])) == in_place


def test_a_restarted_replica_is_stale_for_a_resumed_run(reloadable: LocalLauncher) -> None:
    """After the restart above, replica 0 reports vLLM's initial label ("default") while replica 1 still reports
    "3" (the previous test's last update): a run resumed at version 3 finds replica 0 stale and generates on
    replica 1 only."""
    cfg = RolloutConfig(groups=2, group_size=2, rho=0.5, policy="uniform", sampling=SamplingParams(max_tokens=8))

    async def run() -> tuple[Any, set[int], int]:
        async with Rollout(reloadable.endpoints, cfg, PROMPTS) as r:
            state = r.state()
        async with Rollout(reloadable.endpoints, cfg, PROMPTS, state=replace(state, weight_version=3)) as r:
            b = await r.step()
            return r.version_check, {s.replica for g in b.groups for s in g.samples}, b.stale_samples

    check, used, stale = asyncio.run(run())
    assert check.reported == ("default", "3") and check.stale == (0,)
    assert used == {1} and stale == 0
