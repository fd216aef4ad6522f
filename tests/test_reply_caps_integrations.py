"""The framework integrations read replies with the transport's caps and checks (issue 41: size caps on every JSON
reply): verl's `HttpServerHandle` reads a completion within its `reply_limit` and checks it like every generation
reply, slime's sglang-router discovery reads `/workers` (`/list_workers`) within `CONTROL_REPLY_BYTES`, and every
4xx/5xx body is read up to `ERROR_BODY_BYTES` only, its message clipped. Generated: endpoint × delivery (declared
Content-Length or chunked) × size (exactly the cap: read as before; one byte over: refused in one line naming the
cap, before anything is parsed), and verl reply contents × what the handle makes of them. Fake servers in-process;
no engine runs."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from app_thread import AppThread, server_port
from body_fake import BodyFake
from tailsieve.engines.transport.engine_client import (
    ClientOptions,
    Endpoint,
    EngineClient,
    Request,
    RequestRejected,
    SamplingParams,
)
from tailsieve.engines.transport.replies import BadReply
from tailsieve.engines.transport.reply_bounds import CONTROL_REPLY_BYTES, ERROR_BODY_BYTES, reply_limit
from tailsieve.engines.transport.sglang_native import TokenPrompt
from tailsieve.integrations.slime.settings import SlimeIntegrationError, discover_workers
from tailsieve.integrations.verl.http_server import HttpServerHandle, HttpTokenOutput
from tailsieve.redact import EXCERPT_CHARS

PROMPT = [11, 12, 13]
MAX_TOKENS = 4
SECRET = "hf_" + "Q" * 30
VERL_LIMIT = reply_limit(Request("r", TokenPrompt(PROMPT)), MAX_TOKENS)


def padded(doc: dict[str, Any], size: int) -> bytes:
    """`doc` as JSON padded (a `pad` field of spaces) to exactly `size` bytes (0: unpadded)."""
    raw = json.dumps({**doc, "pad": ""}).encode()
    return raw if not size else raw[:-2] + b" " * (size - len(raw)) + b'"}'


def completion(**choice: Any) -> dict[str, Any]:
    """A vLLM `/v1/completions` reply to `PROMPT` (token ids returned), `choice` overriding its one choice."""
    ch = {"index": 0, "text": "abcd", "token_ids": [1, 2, 3, 4], "finish_reason": "length",
          "prompt_token_ids": PROMPT, "logprobs": {"token_logprobs": [-0.5, -1.0, -0.25, 0.0]}} | choice
    tokens = 4 if ch.get("token_ids") is None else len(ch["token_ids"])  # without ids: the text's 4 tokens
    return {"choices": [ch], "usage": {"prompt_tokens": 3, "completion_tokens": tokens}}


@dataclass
class Fake(BodyFake):
    """Answers `routes` (path → (status, body)); any other path is a 404. `chunked`: no Content-Length."""

    routes: dict[str, tuple[int, bytes]]
    chunked: bool = False
    port: int = field(default_factory=server_port)
    _server: AppThread = field(default_factory=lambda: AppThread("integration fake"))

    def reply(self, path: str) -> tuple[int, bytes, str]:
        status, body = self.routes.get(path, (404, b"not found"))
        return status, body, "application/json"


def verl_generate(url: str, make_output: Callable[..., Any] = HttpTokenOutput) -> Any:
    handle = HttpServerHandle(url, "tiny", make_output=make_output, timeout_s=30)
    sp = {"max_tokens": MAX_TOKENS, "logprobs": True}
    return asyncio.run(handle.generate.remote(request_id="ts-0-1-0-0", prompt_ids=PROMPT, sampling_params=sp))


def client_generate(url: str) -> Any:
    async def go() -> Any:
        async with EngineClient(ClientOptions(api_key_env=None, stream=False)) as client:
            return await client.complete(Endpoint(url), "m", Request("r", "p"), SamplingParams(max_tokens=MAX_TOKENS))
    return asyncio.run(go())


def slime_workers(url: str) -> list[str]:
    port = int(url.rsplit(":", 1)[1])
    return [e.url for e in discover_workers(SimpleNamespace(sglang_router_ip="127.0.0.1", sglang_router_port=port))]


WORKERS = {"workers": [{"url": "http://10.0.0.1:30000"}, {"url": "http://10.0.0.2:30000"}]}
ERROR_DOC = {"error": {"message": f"max_tokens is too large; HF_TOKEN={SECRET}", "code": 400}}


# endpoint -> (the fake's routes for a body of `size` bytes, the call, the cap, check within, what over the cap gives)
@dataclass(frozen=True)
class Case:
    routes: Callable[[int], dict[str, tuple[int, bytes]]]
    call: Callable[[str], Any]
    cap: int
    within: Callable[[Any], bool]
    over: type[Exception] | None  # None: no error over the cap (an error body is only cut)


CASES: dict[str, Case] = {
    "verl /v1/completions": Case(lambda n: {"/v1/completions": (200, padded(completion(), n))}, verl_generate,
                                 VERL_LIMIT, lambda out: out.token_ids == [1, 2, 3, 4]
                                 and out.log_probs == [-0.5, -1.0, -0.25, 0.0] and out.stop_reason == "completed",
                                 BadReply),
    "slime /workers": Case(lambda n: {"/workers": (200, padded(WORKERS, n))}, slime_workers, CONTROL_REPLY_BYTES,
                           lambda out: out == ["http://10.0.0.1:30000", "http://10.0.0.2:30000"],
                           SlimeIntegrationError),
    "slime /list_workers": Case(lambda n: {"/list_workers": (200, padded({"urls": ["http://10.0.0.3:1"]}, n))},
                                slime_workers, CONTROL_REPLY_BYTES, lambda out: out == ["http://10.0.0.3:1"],
                                SlimeIntegrationError),
    "verl error body": Case(lambda n: {"/v1/completions": (503, padded(ERROR_DOC, n))}, verl_generate,
                            ERROR_BODY_BYTES, lambda msg: msg.endswith("HTTP 503: max_tokens is too large; HF_TOKEN="
                                                                       "[redacted]"), None),
    "client error body": Case(lambda n: {"/v1/completions": (400, padded(ERROR_DOC, n))}, client_generate,
                              ERROR_BODY_BYTES, lambda msg: msg.endswith("HTTP 400: max_tokens is too large; "
                                                                         "HF_TOKEN=[redacted]"), None),
}
GRID = [(name, chunked, over) for name in CASES for chunked in (False, True) for over in (False, True)]


@pytest.mark.parametrize(("name", "chunked", "over"), GRID,
                         ids=[f"{n}-{'chunked' if c else 'declared'}-{'over' if o else 'within'}" for n, c, o in GRID])
def test_every_integration_reply_is_read_within_its_cap(name: str, chunked: bool, over: bool,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TAILSIEVE_ENGINES", raising=False)
    case = CASES[name]
    with Fake(case.routes(case.cap + 1 if over else case.cap), chunked) as fake:
        if case.over is None:  # an error body: its message when within, else a clipped prefix of it
            with pytest.raises((RuntimeError, RequestRejected, BadReply)) as err:
                case.call(fake.url)
            msg = str(err.value)
            assert "\n" not in msg and SECRET not in msg, msg
            if over:  # cut at the cap: no longer JSON, so its text is quoted, at most EXCERPT_CHARS of it
                quoted = re.split(r"HTTP \d+:? ", msg, maxsplit=1)[1]
                assert quoted.startswith('{"error": {"message": "max_tokens is too large; HF_TOKEN=[redacted]"'), msg
                assert len(quoted.split("…")[0]) == EXCERPT_CHARS, msg
            else:
                assert case.within(msg), msg
        elif over:
            with pytest.raises(case.over) as err:
                case.call(fake.url)
            msg = str(err.value)
            assert "\n" not in msg and f"over {case.cap} bytes" in msg, msg
        else:
            assert case.within(case.call(fake.url))


# a verl completion's contents -> the handle's output (token ids, logprobs, stop reason) or the BadReply it gives
CONTENTS: dict[str, tuple[dict[str, Any], str | tuple[list[int], list[float] | None, str]]] = {
    "plain": (completion(), ([1, 2, 3, 4], [-0.5, -1.0, -0.25, 0.0], "completed")),
    "no logprobs": (completion(logprobs=None), ([1, 2, 3, 4], None, "completed")),
    "aborted with partial output": (completion(finish_reason="abort", token_ids=[1, 2], text="ab",
                                               logprobs={"token_logprobs": [-0.5, -1.0]}),
                                    ([1, 2], [-0.5, -1.0], "aborted")),
    "logprob above 0": (completion(logprobs={"token_logprobs": [-0.5, 7.5, -0.25, 0.0]}), "logprob is 7.5"),
    "logprob null": (completion(logprobs={"token_logprobs": [-0.5, None, -0.25, 0.0]}), "logprob is None"),
    "logprobs not one per token": (completion(logprobs={"token_logprobs": [-0.5]}), "1 logprobs for 4 tokens"),
    "more tokens than max_tokens": (completion(token_ids=[1, 2, 3, 4, 5]), "completion_tokens is 5, expected an "),
    "no token ids": (completion(token_ids=None), "choice 0 has no token_ids"),
    "token id not an integer": (completion(token_ids=[1, "2", 3, 4]), "token_ids is '2'"),
    "other prompt ids": (completion(prompt_token_ids=[11, 12, 99]), "prompt_token_ids differ from the 3"),
    "unknown finish reason": (completion(finish_reason="weird"), "finish_reason is 'weird'"),
    "no choices": ({"choices": []}, "0 choices returned, 1 requested"),
    "two choices": ({"choices": [completion()["choices"][0], {**completion()["choices"][0], "index": 1}]},
                    "choice index is 1"),
}


@pytest.mark.parametrize("name", list(CONTENTS))
def test_a_verl_completion_is_checked_like_every_generation_reply(name: str) -> None:
    doc, want = CONTENTS[name]
    with Fake({"/v1/completions": (200, json.dumps(doc).encode())}) as fake:
        if isinstance(want, str):
            with pytest.raises(BadReply) as err:
                verl_generate(fake.url)
            msg = str(err.value)
            assert "\n" not in msg and msg.startswith(f"{fake.url}: bad-reply: ") and want in msg, msg
        else:
            out = verl_generate(fake.url)
            assert (out.token_ids, out.log_probs, out.stop_reason) == want
            assert out.extra_fields["finish_reason"] == doc["choices"][0]["finish_reason"]


@pytest.mark.extra("verl")
def test_the_checked_reply_fills_verls_own_token_output() -> None:
    from verl.workers.rollout.replica import TokenOutput

    with Fake({"/v1/completions": (200, json.dumps(completion()).encode())}) as fake:
        out = verl_generate(fake.url, TokenOutput)
    assert isinstance(out, TokenOutput) and out.token_ids == [1, 2, 3, 4] and out.stop_reason == "completed"
    assert out.log_probs == [-0.5, -1.0, -0.25, 0.0]
