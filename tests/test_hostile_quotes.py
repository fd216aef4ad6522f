"""Error messages quote at most a short, redacted prefix of what came from a file or a reply (issue 41 item 6): long,
secret-bearing content × every reader that quotes a value back (prompt files, the rollout state and its step lines,
saved decisions and router rows, controller tables, model files, endpoint URLs, traces, stream error events, the
verl and slime state they keep) → the error is one line holding at most `EXCERPT_CHARS` characters of the content
(`redact.excerpt` / `clip`, the cut marked `…`) and none of its secrets."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tailsieve.engines.rollout.prompts import load_prompts
from tailsieve.engines.rollout.resume import SavedStep, check_state, check_steps, step_lines
from tailsieve.engines.rollout.state import RolloutState
from tailsieve.engines.transport.stream_replies import raise_stream_error
from tailsieve.engines.transport.types import Endpoint
from tailsieve.errors import TailSieveError
from tailsieve.integrations.slime.data_source import CarryState
from tailsieve.integrations.slime.settings import discover_workers
from tailsieve.integrations.verl.session import member_route
from tailsieve.model.costmodel import model_from_json
from tailsieve.policy.control_state import ControlState
from tailsieve.policy.controller import CONTROLLERS
from tailsieve.policy.controller_knobs import controller_from_mapping
from tailsieve.policy.decision import Decision
from tailsieve.policy.router import Router, RouterConfig, RouterState
from tailsieve.policy.step import GroupRef
from tailsieve.redact import EXCERPT_CHARS
from tailsieve.workloads.traces import read_trace

PAD = "Z" * 400  # a run no error may quote more than EXCERPT_CHARS of
# secret-bearing prefixes (the secret in the first characters, where an excerpt would show it) → the secret
SECRETS = {
    "HF_TOKEN=hf_qwertyuiopasdfghjkl ": "hf_qwertyuiopasdfghjkl",
    "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI-K7MDENG ": "wJalrXUtnFEMI-K7MDENG",
    "sk-proj-0123456789abcdef ": "sk-proj-0123456789abcdef",
    "https://admin:correct-horse-battery@db.internal ": "correct-horse-battery",
}


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _router() -> Router:
    return Router(RouterConfig(groups=1, group_size=1, replicas=2), ["a", "b"])


def _state(generation: dict[str, int], waiting: tuple[GroupRef, ...] = ()) -> RolloutState:
    router = _router().initial_state()
    if waiting:
        router = RouterState(step=0, stream=router.stream, candidates=waiting, consumed=0)
    return RolloutState("uniform", {}, router, ControlState(0, 0), generation)


def _saved(prompt: str) -> list[SavedStep]:
    return [SavedStep("steps.jsonl, line 1", None, np.ones((1, 1), np.int64), (0,), (prompt,),  # type: ignore[arg-type]
                      np.zeros(1, np.int64), None, None, 0.0)]


STATE = {"version": 1, "policy": "uniform", "fingerprint": {}, "router": {}, "control": {}, "generation": {}}

# reader → how the hostile content `c` reaches it (under the test's folder); each call must raise
READERS: dict[str, Callable[[Path, str], object]] = {
    "prompt file: id of another type": lambda d, c: load_prompts(_jsonl(d / "p.jsonl", [{"id": [c], "prompt": "x"}])),
    "prompt file: repeated id": lambda d, c: load_prompts(_jsonl(d / "p.jsonl", [
        {"id": f"{c}#1", "prompt": "a"}, {"id": c, "prompt": "b"}, {"id": c, "prompt": "c"}])),
    "state.json: version": lambda d, c: RolloutState.from_json(STATE | {"version": c}),
    "state.json: a generation counter's prompt": lambda d, c: RolloutState.from_json(STATE | {"generation": {c: -1}}),
    "state.json: counter of an unknown prompt": lambda d, c: check_state(_state({c: 1}), {}, "uniform", _router()),
    "state.json: a waiting group's prompt": lambda d, c: check_state(_state({}, (GroupRef(0, c),)), {}, "uniform",
                                                                      _router()),
    "steps.jsonl: step": lambda d, c: step_lines(_jsonl(d / "steps.jsonl", [{"step": c}])),
    "steps.jsonl: a group's prompt": lambda d, c: check_steps(_saved(c), _router()),
    "saved decision: reason": lambda d, c: Decision.from_json({"q": 0, "m": 0, "reason": c}),
    "saved router: a waiting row": lambda d, c: RouterState.from_json(
        {"step": 0, "stream": None, "requeue": [[0, "a", 0, c]], "candidates": [], "consumed": 0}),
    "controller table: a value": lambda d, c: controller_from_mapping({"z": c}, "config [controller]"),
    "controller table: a field name": lambda d, c: controller_from_mapping({c: 1}, "config [controller]"),
    "model file: cost_model.format": lambda d, c: model_from_json(
        {"batch": [1, 2], "tpot_ms": [10.0, 11.0], "cost_model": {"format": c}}, "model.json"),
    "endpoint URL": lambda d, c: Endpoint.parse(f"http://{c}"),
    "slime worker list": lambda d, c: discover_workers(SimpleNamespace(tailsieve_engines=f"http://{c}")),
    "trace: a repeated prompt's id": lambda d, c: read_trace(_jsonl(d / "t.jsonl", [
        {"prompt_id": c, "sample": 0, "length": 5}, {"prompt_id": c, "sample": 0, "length": 6}])),
    "stream error event": lambda d, c: raise_stream_error("http://127.0.0.1:1", {"message": c, "code": 500}),
    "verl route": lambda d, c: member_route(c, 0),
    "slime carry state: version": lambda d, c: CarryState.from_json({"version": c}),
    "registry name": lambda d, c: CONTROLLERS.add(f" {c}", object()),
}


@pytest.mark.parametrize("prefix", list(SECRETS), ids=[s.split("=")[0].split(":")[0] for s in SECRETS])
@pytest.mark.parametrize("reader", list(READERS))
def test_an_error_quotes_a_short_redacted_prefix_of_long_content(reader: str, prefix: str, tmp_path: Path) -> None:
    content = prefix + PAD
    with pytest.raises((TailSieveError, ValueError)) as err:  # a one-line error of the reader's own type
        READERS[reader](tmp_path, content)
    msg = str(err.value)
    assert "\n" not in msg, msg
    assert SECRETS[prefix] not in msg, msg
    assert "Z" * (EXCERPT_CHARS + 1) not in msg and "Z" * 8 in msg, msg  # quoted, but at most a prefix
    assert "… (" in msg and " characters)" in msg, msg  # the cut is marked, with the whole length
