"""`TrlSession` (integrations/trl/session.py) against fake vLLM servers (tests/engine_fake.py: a sample's length is a
fixed function of its prompt text): every step hands TRL N groups of G rows, each sample next to **its own** dataset
row (its length is the one its row's prompt gives, carried groups included), every row consumed once; the weight push
saves the model and reloads that folder on every replica; bad datasets and sizes are one-line errors."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine_fake import FAKE_PROMPT_IDS, FakeServer, fake_length, fake_logprob
from tailsieve.engines.rollout.api import RolloutConfig
from tailsieve.engines.transport.engine_client import SamplingParams
from tailsieve.integrations.trl.session import TrlIntegrationError, TrlSession

CAP = 40
ROWS = [{"prompt": f"row {i} asks", "answer": str(i * 4), "meta": {"row": i}} for i in range(40)]


@pytest.fixture
def servers() -> Iterator[list[FakeServer]]:
    with FakeServer() as a, FakeServer() as b, FakeServer() as c:
        yield [a, b, c]


def session(servers: list[FakeServer], tmp_path: Path, rows: Any = ROWS, **kw: Any) -> TrlSession:
    config = RolloutConfig(groups=3, group_size=4, rho=0.67, policy="static", q=1, m=1, seed=None,
                           sampling=SamplingParams(max_tokens=CAP))
    return TrlSession([s.url for s in servers], config, rows, checkpoints=tmp_path / "ck", **kw)


def test_every_sample_comes_with_its_own_row_and_each_row_is_consumed_once(servers: list[FakeServer],
                                                                           tmp_path: Path) -> None:
    s = session(servers, tmp_path)
    consumed: list[int] = []
    carried = 0
    try:
        for _ in range(5):
            p = s.step(ROWS[:12])
            assert len(p.rows) == len(p.prompt_ids) == len(p.completion_ids) == len(p.logprobs) == 12
            for k in range(0, 12, 4):  # G consecutive samples share one row, TRL's group layout
                assert all(r == p.rows[k] for r in p.rows[k:k + 4])
            for row, ids, comp, lps in zip(p.rows, p.prompt_ids, p.completion_ids, p.logprobs, strict=True):
                assert row == ROWS[row["meta"]["row"]]
                assert len(comp) == fake_length(json.dumps(row["prompt"]), None, 0, CAP)  # its own prompt's length
                assert list(ids) == FAKE_PROMPT_IDS and list(lps) == [fake_logprob(t) for t in range(len(comp))]
            assert [r["meta"]["row"] for r in p.rows[::4]] == list(p.stats.consumed_rows)
            assert p.stats.requested_rows == (0, 4, 8) and p.stats.stale_samples == 0
            consumed += p.stats.consumed_rows
            carried += p.stats.carried_in
    finally:
        s.close()
    assert carried > 0  # some consumed groups were cut at an earlier step, and still came with their own rows
    assert len(consumed) == len(set(consumed)) == 15
    assert [h.step for h in s.history] == [0, 1, 2, 3, 4]


def test_rollout_output_is_trls_dict_of_lists(servers: list[FakeServer], tmp_path: Path) -> None:
    s = session(servers, tmp_path)
    try:
        p = s.step()
    finally:
        s.close()
    out = p.output()
    assert sorted(out) == ["completion_ids", "logprobs", "prompt_ids"]
    assert out["prompt_ids"] == [list(x) for x in p.prompt_ids] and isinstance(out["completion_ids"][0], list)


def test_push_saves_the_model_and_reloads_that_folder_everywhere(servers: list[FakeServer], tmp_path: Path) -> None:
    class Model:  # the one method the push calls on a transformers model
        def save_pretrained(self, folder: str, safe_serialization: bool) -> None:
            Path(folder).mkdir(parents=True)
            (Path(folder) / "config.json").write_text("{}")

    s = session(servers, tmp_path)
    try:
        s.step()
        first = s.push(Model(), 1)
        second = s.push(Model(), 2)
        p = s.step()
    finally:
        s.close()
    folder = str((tmp_path / "ck" / "step-00002").resolve())
    assert (first.version, second.version) == (1, 2) and second.updated == 3
    assert [srv.reloads[-1] for srv in servers] == [folder] * 3
    assert not (tmp_path / "ck" / "step-00001").exists()  # the previous checkpoint is removed once replaced
    assert p.stats.weight_version == 2 and p.stats.stale_samples == 0 and len(s.updates) == 2


def test_a_batch_of_another_size_is_refused(servers: list[FakeServer], tmp_path: Path) -> None:
    s = session(servers, tmp_path)
    with pytest.raises(TrlIntegrationError) as err:
        s.step(ROWS[:8])
    s.close()
    assert str(err.value) == ("TRL asked for 8 completions but the TailSieve session makes 3 groups of 4 = 12 per "
                              "step (set generation_batch_size = 12)")
    assert all(srv.started == 0 for srv in servers)  # refused before any request


@pytest.mark.parametrize(("rows", "message"), [
    ([], "the training dataset is empty"),
    ([{"prompt": "a"}, {"question": "b"}], "dataset row 1 has no 'prompt' column"),
    ([{"prompt": [{"role": "user", "content": "hi"}]}],
     "dataset row 0: a conversational prompt needs the tokenizer (chat template)"),
])
def test_bad_datasets_are_one_line(servers: list[FakeServer], tmp_path: Path, rows: Any, message: str) -> None:
    with pytest.raises(TrlIntegrationError) as err:
        session(servers, tmp_path, rows)
    assert str(err.value) == message


def test_conversational_prompts_go_through_the_chat_template(servers: list[FakeServer], tmp_path: Path) -> None:
    class Template:
        def apply_chat_template(self, messages: list[dict[str, str]], tokenize: bool,
                                add_generation_prompt: bool) -> str:
            assert tokenize is False and add_generation_prompt is True
            return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"

    rows = [{"prompt": [{"role": "user", "content": f"q{i}"}]} for i in range(12)]
    s = session(servers, tmp_path, rows, tokenizer=Template())
    try:
        s.step()
    finally:
        s.close()
    sent = {b["prompt"] for srv in servers for b in srv.bodies}
    assert sent <= {f"<user>q{i}<assistant>" for i in range(12)} and sent


def test_run_refuses_a_thread_with_a_running_loop(servers: list[FakeServer], tmp_path: Path) -> None:
    s = session(servers, tmp_path)

    async def inside() -> None:
        s.open()

    with pytest.raises(TrlIntegrationError, match="call it from a thread without a running event loop"):
        asyncio.run(inside())
    s.close()
