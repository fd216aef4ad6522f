"""Every reply that is not a generation has one byte cap (issue 41: a `/v1/models` reply of 600k models was 399 MB):
generated endpoints × delivery (Content-Length declared, or chunked) × size (within the cap: read as before; one
byte over: refused in one line naming the cap, before anything is parsed). Generation replies have their own,
per-request cap (`reply_limit`, tests/test_reply_classes.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from app_thread import AppThread, server_port
from body_fake import BodyFake
from tailsieve.engines.measure.profile import server_max_len
from tailsieve.engines.measure.spec_measure import read_counters
from tailsieve.engines.transport.engine_client import ClientOptions, Endpoint, EngineClient, EngineError
from tailsieve.engines.transport.replies import BadReply
from tailsieve.engines.transport.reply_bounds import CONTROL_REPLY_BYTES

JSON_DOC = {"data": [{"id": "m", "max_model_len": 100}], "weight_version": "3", "success": True,
            "results": [None]}
METRICS = ("vllm:spec_decode_num_drafts_total 4\nvllm:spec_decode_num_draft_tokens_total 8\n"
           "vllm:spec_decode_num_accepted_tokens_total 2\nvllm:generation_tokens_total 20\n"
           "vllm:num_requests_running 1\n")


def _json_body(size: int) -> bytes:
    """`JSON_DOC` padded to exactly `size` bytes (0: unpadded)."""
    raw = json.dumps({**JSON_DOC, "pad": ""}).encode()
    return raw if not size else raw[:-2] + b" " * (size - len(raw)) + b'"}'


def _metrics_body(size: int) -> bytes:
    raw = METRICS.encode()
    if not size:
        return raw
    head = b"# "
    return head + b"p" * (size - len(raw) - len(head) - 1) + b"\n" + raw


@dataclass
class SizeFake(BodyFake):
    """Answers every path with a JSON document (or, on /metrics, Prometheus text) of `size` bytes; `chunked`
    sends it without a Content-Length."""

    size: int = 0
    chunked: bool = False
    port: int = field(default_factory=server_port)
    _server: AppThread = field(default_factory=lambda: AppThread("size fake"))

    def reply(self, path: str) -> tuple[int, bytes, str]:
        if path == "/metrics":
            return 200, _metrics_body(self.size), "text/plain"
        return 200, _json_body(self.size), "application/json"


Call = Callable[[EngineClient, Endpoint, Path], Awaitable[Any]]


async def _sglang(client: EngineClient, ep: Endpoint, what: str, tmp: Path) -> Any:
    sg = Endpoint(ep.url, "sglang")
    backend = client.backend(sg)
    if what == "version":
        return await backend.served_version(client.session, sg)
    return await backend.update_weights(client.session, sg, str(tmp), 3)


# endpoint -> (the call, what it gives within the cap, what it does over the cap: an exception type, or a value)
ENDPOINTS: dict[str, tuple[Call, Any, Any]] = {
    "/v1/models": (lambda c, e, t: c.models(e), ["m"], BadReply),
    "/metrics": (lambda c, e, t: c.metrics(e), None, BadReply),
    "/weight_info": (lambda c, e, t: c.backend(e).served_version(c.session, e), "3", EngineError),
    "/update_weight_version": (lambda c, e, t: c.backend(e).tag_version(c.session, e, 3), None, EngineError),
    "/collective_rpc": (lambda c, e, t: c.backend(e).update_weights(c.session, e, str(t), 3), None, EngineError),
    "/model_info": (lambda c, e, t: _sglang(c, e, "version", t), "3", EngineError),
    "/update_weights_from_disk": (lambda c, e, t: _sglang(c, e, "update", t), None, EngineError),
    "profile /v1/models": (lambda c, e, t: server_max_len(c, e), 100, None),  # optional: None over the cap
    "profile /metrics": (lambda c, e, t: read_counters(c, e), "counters", None),  # optional: None over the cap
}
CASES = [(ep, chunked, over) for ep in ENDPOINTS for chunked in (False, True) for over in (False, True)]


@pytest.mark.parametrize(("endpoint", "chunked", "over"), CASES,
                         ids=[f"{e}-{'chunked' if c else 'declared'}-{'over' if o else 'within'}" for e, c, o in CASES])
def test_every_non_generation_reply_has_one_byte_cap(endpoint: str, chunked: bool, over: bool,
                                                     tmp_path: Path) -> None:
    call, within, beyond = ENDPOINTS[endpoint]

    async def go(url: str) -> Any:
        async with EngineClient(ClientOptions(api_key_env=None)) as client:
            return await call(client, Endpoint(url), tmp_path)

    with SizeFake(CONTROL_REPLY_BYTES + 1 if over else 0, chunked) as fake:
        if not over:
            got = asyncio.run(go(fake.url))
            if endpoint == "/metrics":
                assert got["vllm:num_requests_running"] == 1.0
            elif within == "counters":
                assert got is not None and got.drafts == 4.0 and got.generated == 20.0
            else:
                assert got == within
        elif beyond is None:
            assert asyncio.run(go(fake.url)) is None
        else:
            with pytest.raises(beyond) as e:
                asyncio.run(go(fake.url))
            msg = str(e.value)
            assert "\n" not in msg and f"over {CONTROL_REPLY_BYTES} bytes" in msg, msg
