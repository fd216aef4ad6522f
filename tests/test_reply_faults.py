"""Server replies are untrusted (issue 15): the fault matrix, one misbehaving fake server beside a healthy one.

Every row runs one `Rollout` step on replicas [bad, healthy] and checks that the step completes with every group
exactly once, that the bad replica is marked down with the reason in the table, that no traceback escapes and that
the hangs end within a bound. What the user sees for each reply kind (`tailsieve rollout`, the `Rollout` API):

| reply kind                                         | stream | seen as             | what the user sees           |
|----------------------------------------------------|--------|---------------------|------------------------------|
| `: keep-alive` comment lines, no tokens            | yes    | `stall`             | replica down after           |
|                                                    |        |                     | `--stall-timeout`, work      |
|                                                    |        |                     | re-dispatched, step done     |
| `data: {"choices": []}` forever                    | yes    | `stall`             | same                         |
| body dripping one space at a time, never ending    | no     | `stall`             | same (whole request bounded) |
| a token per tick, never finishing                  | yes    | `deadline`          | down after `--deadline`      |
| `choices` a string                                 | both   | `bad-reply`         | down at once, re-dispatched  |
| a stream chunk that is a JSON list                 | yes    | `bad-reply`         | same                         |
| a body that is a JSON list / not JSON              | both   | `bad-reply`         | same                         |
| `"index": null` / index outside [0, n)             | both   | `bad-reply`         | same                         |
| `completion_tokens` `Infinity`, 10^30 or negative  | both   | `bad-reply`         | same (no negative lengths)   |
| `{"choices": []}`                                  | no     | `bad-reply`         | same                         |
| `{"choices": [{}]}` (no finish reason)             | both   | `bad-reply`         | same (no empty "finished")   |
| fewer choices than `n`                             | both   | `bad-reply`         | same (the step goes on)      |
| `/v1/models` malformed or 5xx on the first replica | -      | `bad-reply` / `5xx` | next endpoint names the model|
| `/v1/models` bad on every replica                  | -      | `ConfigError`       | one line naming each reason  |
| malformed `/metrics` text                          | -      | `bad-reply`         | one-line error               |
| 4xx/5xx whose body echoes `Authorization`          | -      | `RequestRejected` / | one-line error, the key      |
|                                                    |        | `5xx`               | shown as `[redacted]`        |
| `--give-up-after inf` (every server dead)          | -      | flag error          | `--give-up-after must be a   |
|                                                    |        |                     | finite number of seconds...` |
| `profile`: 5xx, refused, stall, deadline           | both   | retried             | batch measured again         |
|                                                    |        |                     | (`--retries`, backoff)       |

Issue 23's generated classes of replies (finish reasons, token ids against text and counts, the byte cap, a replica
shutting down): tests/test_reply_classes.py; what both files share: tests/reply_harness.py. Endpoint URLs and their
credentials: tests/test_endpoints.py.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

from bad_fake import BadFake
from conftest import all_text
from engine_fake import FakeServer
from reply_harness import BAD, BOUND_S, POLICY, cfg, check_complete, one_step
from tailsieve.cli import main
from tailsieve.engines.rollout.engine_executor import RequestMode
from tailsieve.engines.transport.engine_client import ClientOptions, Endpoint, EngineClient, EngineError, parse_metrics
from tailsieve.engines.transport.replies import ReplyError
from tailsieve.engines.transport.types import SamplingParams
from tailsieve.errors import ConfigError

MATRIX: list[tuple[str, bool, str, dict[str, object]]] = [
    ("keepalive", True, "stall", {}),
    ("empty-events", True, "stall", {}),
    ("drip", False, "stall", {}),
    ("endless", True, "deadline", {"deadline_s": 1.5}),
    ("choices-string", True, BAD, {}),
    ("choices-string", False, BAD, {}),
    ("chunk-list", True, BAD, {}),
    ("list", False, BAD, {}),
    ("not-json", True, BAD, {}),
    ("not-json", False, BAD, {}),
    ("index-null", True, BAD, {}),
    ("index-null", False, BAD, {}),
    ("index-out-of-range", True, BAD, {}),
    ("tokens-inf", True, BAD, {}),
    ("tokens-inf", False, BAD, {}),
    ("tokens-huge", True, BAD, {}),
    ("tokens-huge", False, BAD, {}),
    ("tokens-negative", True, BAD, {}),
    ("tokens-negative", False, BAD, {}),
    ("choices-empty", False, BAD, {}),
    ("empty-choice", True, BAD, {}),
    ("empty-choice", False, BAD, {}),
    ("few-choices", True, BAD, {"mode": RequestMode.N}),
    ("few-choices", False, BAD, {"mode": RequestMode.N}),
    ("models-bad", True, BAD, {}),
    ("models-500", True, "5xx", {}),
]


@pytest.mark.parametrize(("reply", "stream", "reason", "extra"), MATRIX,
                         ids=[f"{r}-{'stream' if s else 'full'}" for r, s, _, _ in MATRIX])
def test_bad_reply_marks_the_replica_down_and_the_step_completes(reply: str, stream: bool, reason: str,
                                                                 extra: dict[str, object]) -> None:
    with BadFake(reply=reply) as bad, FakeServer() as good:
        t0 = time.monotonic()
        c = cfg(stream, extra.get("deadline_s"), extra.get("mode", RequestMode.SPLIT))  # type: ignore[arg-type]
        batch, events = asyncio.run(one_step([bad.url, good.url], c))
        assert time.monotonic() - t0 < BOUND_S
    check_complete(batch)
    downs = [why for i, up, why in events if i == 0 and not up]
    assert downs and downs[0].startswith(f"{reason}:"), events
    assert all(i == 0 for i, _, _ in events)  # the healthy replica never went down


def test_models_on_every_endpoint_bad_is_one_line() -> None:
    with BadFake(reply="models-bad") as a, BadFake(reply="models-empty") as b, \
            pytest.raises(ConfigError, match=r"no endpoint names a served model .*bad-reply.*serves no model"):
        asyncio.run(one_step([a.url, b.url], cfg(True)))


def test_reply_errors_never_escape_as_tracebacks() -> None:
    """The client raises only its own one-line errors for every reply kind (the executor relies on it)."""
    from bad_fake import FULL, STREAM

    async def go(url: str, stream: bool) -> None:
        async with EngineClient(ClientOptions(stream=stream, stall_timeout_s=1.0)) as c:
            from tailsieve.engines.transport.types import Request
            await c.complete(Endpoint(url), "fake", Request("r", "hi", n=2), SamplingParams(max_tokens=5))

    for stream, kinds in ((True, STREAM), (False, FULL)):
        for kind in kinds:
            with BadFake(reply=kind) as bad:
                with pytest.raises(EngineError) as info:
                    asyncio.run(go(bad.url, stream))
                assert "\n" not in str(info.value) and str(info.value).startswith(bad.url)


def test_metrics_read_with_the_prometheus_parser() -> None:
    assert parse_metrics('a{x="1"} 2\na{x="2"} 3\n# c\nb 1') == {"a": 5.0, "b": 1.0}
    text = '# TYPE vllm:x counter\nvllm:x_total{e="0"} 2\nvllm:x_total{e="1"} 3\n'
    assert parse_metrics(text) == {"vllm:x_total": 5.0}
    with pytest.raises(ReplyError):
        parse_metrics('vllm:num_requests_running{model_name="fake" 3\n')

    async def go(url: str) -> object:
        async with EngineClient() as c:
            return await c.metrics(Endpoint(url))

    with BadFake(reply="metrics-bad") as bad, pytest.raises(EngineError, match="bad-reply: malformed /metrics"):
        asyncio.run(go(bad.url))


@pytest.mark.parametrize("value", ["inf", "nan", "-1"])
def test_give_up_after_must_be_finite(value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"question_id": "q0", "question": "1+1?"}) + "\n")
    t0 = time.monotonic()
    rc = main(["rollout", "--endpoints", "http://127.0.0.1:9", "--prompts", str(prompts), "--groups", "2",
               "--group-size", "2", "--give-up-after", value, "--out", str(tmp_path / "o")])
    assert rc == 1 and time.monotonic() - t0 < BOUND_S
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--give-up-after must be a finite number >= 0" in err


@pytest.mark.parametrize("flag", ["--stall-timeout", "--deadline"])
def test_time_flags_must_be_finite(flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["profile", "--endpoint", "http://127.0.0.1:9", flag, "inf", "--out", str(tmp_path / "c.json")])
    assert rc == 1 and f"{flag} must be a finite number of seconds > 0" in capsys.readouterr().err


@pytest.mark.parametrize("status", [401, 500])
def test_api_key_echoed_by_a_server_is_never_shown(status: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    key = "tsk-very-secret-0123456789"
    monkeypatch.setenv("TAILSIEVE_API_KEY", key)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"question_id": f"q{i}", "question": f"{i}+1?"}) + "\n" for i in range(8)))
    with BadFake(echo=status) as a, BadFake(echo=status) as b:
        rc = main(["rollout", "--endpoints", f"{a.url},{b.url}", "--prompts", str(prompts), "--groups", "2",
                   "--group-size", "2", "--max-tokens", "8", "--retries", "1", "--give-up-after", "0.2",
                   "--out", str(tmp_path / "run")])
        assert a.started + b.started >= 1
    cap = capsys.readouterr()
    assert rc == 1 and f"HTTP {status}" in cap.err and "[redacted]" in cap.err
    assert key not in all_text(tmp_path, (cap.out, cap.err))
    with BadFake(echo=status) as bad:
        rc = main(["profile", "--endpoint", bad.url, "--served-model-name", "fake", "--batches", "1",
                   "--max-tokens", "4", "--out", str(tmp_path / "c.json")])
    cap = capsys.readouterr()
    assert rc == 1 and "[redacted]" in cap.err and key not in all_text(tmp_path, (cap.out, cap.err))


def test_profile_retries_transient_faults(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with FakeServer() as srv:
        flip = _flip_after(srv, 3)  # three 5xx replies, then the server answers
        rc = main(["profile", "--endpoint", srv.url, "--served-model-name", "fake", "--batches", "1,2",
                   "--max-tokens", "6", "--contexts", "0", "--stall-timeout", "5", "--retries", "4",
                   "--out", str(tmp_path / "c.json")])
        flip()
    assert rc == 0, capsys.readouterr().err
    doc = json.loads((tmp_path / "c.json").read_text())
    assert [p["batch"] for p in doc["points"]] == [1, 2] and all(p["tokens_per_s"] > 0 for p in doc["points"])


def _flip_after(srv: FakeServer, k: int) -> object:
    """Make `srv` answer 500 to its first k completions, then normally (FakeServer counts `started`)."""
    srv.mode, srv.fail_after, srv.then = "500", None, "500"
    original = srv._mode

    def mode() -> str:
        return "500" if srv.started <= k else "ok"

    srv._mode = mode  # type: ignore[method-assign]
    return lambda: setattr(srv, "_mode", original)


def test_profile_gives_up_after_its_retries_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with FakeServer(mode="500") as srv:
        t0 = time.monotonic()
        rc = main(["profile", "--endpoint", srv.url, "--served-model-name", "fake", "--batches", "1",
                   "--max-tokens", "4", "--retries", "2", "--out", str(tmp_path / "c.json")])
        assert time.monotonic() - t0 < BOUND_S
    err = capsys.readouterr().err.strip()
    assert rc == 1 and err.count("\n") == 0 and "attempt 3 of 3" in err and "5xx" in err


def test_profile_stall_flag_ends_a_keepalive_stream(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with BadFake(reply="keepalive") as bad:
        t0 = time.monotonic()
        rc = main(["profile", "--endpoint", bad.url, "--served-model-name", "fake", "--batches", "1",
                   "--max-tokens", "4", "--stall-timeout", "0.3", "--retries", "1", "--out", str(tmp_path / "c.json")])
        assert time.monotonic() - t0 < BOUND_S
    err = capsys.readouterr().err
    assert rc == 1 and "stall: no tokens for 0.3s" in err


@pytest.mark.parametrize("reply", ["choices-string", "tokens-negative", "empty-choice"])
def test_a_bad_replica_that_answers_its_probes_does_not_fail_the_step(reply: str) -> None:
    """Probed back within milliseconds (its /health is fine), the bad replica may get work again and fail again;
    a failed request is re-dispatched after the replica is marked down, so the step still completes."""
    flappy = replace(POLICY, probe_interval_s=0.02, probe_max_s=0.02, backoff_s=0.1, retries=2)
    with BadFake(reply=reply) as bad, FakeServer() as good:
        c = replace(cfg(True), faults=flappy, groups=4)
        batch, events = asyncio.run(one_step([bad.url, good.url], c))
    check_complete(batch)
    assert sum(1 for i, up, _ in events if i == 0 and not up) >= 1
