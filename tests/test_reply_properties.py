"""Property tests of the reply boundary (`engines/transport/replies.py`): any JSON value a server may send, as a whole
response, a stream of chunks or a `/v1/models` reply, is either parsed into a valid record or rejected with a
one-line `ReplyError`; never another exception, never a record that breaks the contract (n choices, every one
finished, token counts within [0, max_tokens], logprobs and ids as long as the tokens they describe). About half
the generated replies are well-formed (measured: 312 of 600 full replies, 170 of 400 streams parse), so both
branches are exercised."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tailsieve.engines.transport.replies import ReplyError, loads, model_names, parse_chunk, parse_full
from tailsieve.engines.transport.stream_replies import StreamAcc
from tailsieve.engines.transport.types import Completion

CAP = 32
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8))
JSON = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                     st.dictionaries(st.text(max_size=6), inner, max_size=4)),
                    max_leaves=20)
FINISH = st.sampled_from(["stop", "length", None, 3, "", "abort"])
IDS = st.one_of(st.none(), st.lists(st.integers(-3, 2**33), max_size=6), st.text(max_size=3))


@st.composite
def choice(draw: st.DrawFn) -> dict[str, Any]:
    """A choice that is often well-formed and sometimes broken in one field."""
    ch: dict[str, Any] = {"index": draw(st.one_of(st.integers(-1, 3), st.none(), st.text(max_size=2))),
                          "text": draw(st.one_of(st.text(max_size=5), st.none(), st.integers())),
                          "finish_reason": draw(FINISH), "token_ids": draw(IDS)}
    if draw(st.booleans()):
        ch["logprobs"] = draw(st.one_of(
            st.fixed_dictionaries({"token_logprobs": st.lists(st.one_of(st.floats(-30, 0), st.none(), st.text()),
                                                              max_size=6)}),
            st.fixed_dictionaries({"content": st.lists(st.fixed_dictionaries({"logprob": st.floats()}), max_size=6)}),
            JSON))
    if draw(st.booleans()):
        ch["prompt_token_ids"] = draw(IDS)
    if draw(st.booleans()):
        ch[draw(st.sampled_from(["index", "text", "finish_reason", "token_ids"]))] = draw(JSON)
    return ch


@st.composite
def good_choice(draw: st.DrawFn, i: int) -> dict[str, Any]:
    """A well-formed choice: ids within the cap, logprobs one per token (sometimes), a finish reason."""
    ids = draw(st.lists(st.integers(0, 500), max_size=6))
    finish = draw(st.sampled_from(["stop", "length"]))
    ch: dict[str, Any] = {"index": i, "text": "x" * len(ids), "finish_reason": finish, "token_ids": ids}
    if draw(st.booleans()):
        ch["logprobs"] = {"token_logprobs": [draw(st.floats(-20, 0)) for _ in ids]}
    return ch


@st.composite
def reply(draw: st.DrawFn, n: int) -> Any:
    """A whole response object for n choices: well-formed, well-formed with one field replaced by any JSON value,
    shaped like OpenAI's with random choices, or any JSON value at all."""
    mode = draw(st.integers(0, 5))
    if mode == 0:
        return draw(JSON)
    if mode == 1:
        return {"choices": draw(st.one_of(st.lists(choice(), max_size=4), JSON))}
    out: dict[str, Any] = {"choices": [draw(good_choice(i)) for i in range(n)]}
    if draw(st.booleans()):
        out["usage"] = {"prompt_tokens": draw(st.integers(0, 50)),
                        "completion_tokens": sum(len(c["token_ids"]) for c in out["choices"])}
    if mode == 2:  # one field of one choice (or the usage) replaced by anything
        target = out["choices"][draw(st.integers(0, n - 1))]
        target[draw(st.sampled_from(["index", "text", "finish_reason", "token_ids", "logprobs"]))] = draw(JSON)
    return out


def stream_of(full: Any, draw: st.DrawFn) -> list[Any]:
    """The chunks of a reply sent as a stream: each choice's tokens in one or two events, the last with its finish."""
    if not isinstance(full, dict) or not isinstance(full.get("choices"), list):
        return [full]
    chunks: list[Any] = []
    for ch in full["choices"]:
        ids = ch.get("token_ids") if isinstance(ch, dict) else None
        if not isinstance(ids, list) or len(ids) < 2 or not draw(st.booleans()):
            chunks.append({"choices": [ch]})
            continue
        cut = len(ids) // 2
        first = {**ch, "token_ids": ids[:cut], "finish_reason": None, "text": "x" * cut}
        lp = ch.get("logprobs")
        if isinstance(lp, dict) and isinstance(lp.get("token_logprobs"), list):
            first["logprobs"] = {"token_logprobs": lp["token_logprobs"][:cut]}
            ch = {**ch, "logprobs": {"token_logprobs": lp["token_logprobs"][cut:]}}
        chunks += [{"choices": [first]}, {"choices": [{**ch, "token_ids": ids[cut:]}]}]
    return chunks


def check_completion(comp: Completion, n: int) -> None:
    """The contract every parsed completion keeps."""
    assert len(comp.choices) == n and [c.index for c in comp.choices] == list(range(n))
    for c in comp.choices:
        assert isinstance(c.finish_reason, str) and 0 <= c.tokens <= CAP
        if c.token_ids is not None:
            assert len(c.token_ids) == c.tokens and all(t >= 0 for t in c.token_ids)
        if c.logprobs is not None:
            assert all(isinstance(x, float) for x in c.logprobs)
            assert c.token_ids is None or len(c.logprobs) == len(c.token_ids)
    assert comp.prompt_tokens >= 0


@settings(max_examples=600, deadline=None)
@given(data=st.data(), n=st.integers(1, 3))
def test_full_reply_is_a_valid_completion_or_one_line_error(data: st.DataObject, n: int) -> None:
    obj = data.draw(reply(n))
    try:
        comp = parse_full(obj, n, CAP, 0.1)
    except ReplyError as exc:
        assert str(exc) and "\n" not in str(exc)
    else:
        check_completion(comp, n)


@settings(max_examples=400, deadline=None)
@given(data=st.data(), n=st.integers(1, 3), done=st.booleans())
def test_stream_is_a_valid_completion_or_one_line_error(data: st.DataObject, n: int, done: bool) -> None:
    chunks = stream_of(data.draw(reply(n)), data.draw)
    if data.draw(st.booleans()):  # and sometimes a stray event anywhere
        chunks.insert(data.draw(st.integers(0, len(chunks))), data.draw(reply(n)))
    progress = [0] * n
    acc = StreamAcc(n, CAP, progress)
    try:
        for c in chunks:
            acc.add(parse_chunk(c, n, CAP))
            assert all(0 <= p <= CAP for p in progress)
        comp = acc.result(done, 0.1, None)
    except ReplyError as exc:
        assert str(exc) and "\n" not in str(exc)
    except EOFError:
        assert not done  # an unfinished stream without [DONE] is a dropped connection, retried elsewhere
    else:
        check_completion(comp, n)


@settings(max_examples=300, deadline=None)
@given(raw=st.one_of(st.binary(max_size=40), JSON.map(lambda v: json.dumps(v, allow_nan=True).encode())))
def test_bytes_and_model_lists_never_escape_the_boundary(raw: bytes) -> None:
    try:
        value = loads(raw)
    except ReplyError as exc:
        assert "\n" not in str(exc)
        return
    assert not (isinstance(value, float) and not math.isfinite(value))
    try:
        names = model_names(value)
    except ReplyError as exc:
        assert "\n" not in str(exc)
    else:
        assert all(isinstance(x, str) for x in names)


def _stdlib(payload: bytes) -> Any:
    def reject(name: str) -> Any:
        raise ReplyError(f"JSON constant {name} is not allowed")

    def finite(text: str) -> float:  # a number past a double's range is refused too (issue 41: `1e999`)
        if not math.isfinite(float(text)):
            raise ReplyError(f"number {text[:40]} is out of range")
        return float(text)

    try:
        return json.loads(payload, parse_constant=reject, parse_float=finite)
    except ReplyError:
        raise
    except ValueError as exc:
        raise ReplyError(f"not JSON ({str(exc).splitlines()[0][:80]})") from None


@settings(max_examples=400, deadline=None)
@given(st.one_of(JSON.map(lambda v: json.dumps(v, allow_nan=True).encode()), st.binary(max_size=24),
                 st.sampled_from([b"1e400", b"-1e400", b"18446744073709551616", b'"\\ud800"', b"NaN", b"[1,]",
                                  b'{"a":1,"a":2}', b"\xff", b" 7 ", b""])))
def test_loads_agrees_with_the_standard_library(payload: bytes) -> None:
    """The fast parser (orjson) and the reference (json, NaN/Infinity rejected) give the same value or error."""
    try:
        want: Any = _stdlib(payload)
    except ReplyError as exc:
        want = exc
    try:
        got: Any = loads(payload)
    except ReplyError as exc:
        got = exc
    if isinstance(want, ReplyError):
        assert isinstance(got, ReplyError) and str(got) == str(want)
    else:
        assert json.dumps(got, allow_nan=True) == json.dumps(want, allow_nan=True)


# the fast paths of the usual reply (checked in C) against the per-element checks they stand for ---------------------
ELEMENT = st.one_of(st.integers(-(2**65), 2**65), st.floats(allow_nan=False), st.booleans(), st.none(),
                    st.sampled_from([0, -0.0, 0.0, -1e-300, -5e-324, 2**31 - 1, 2**31]))


def _per_element(check: Any, values: list[Any]) -> tuple[Any, ...] | str:
    try:
        return tuple(check(v) for v in values)
    except ReplyError:
        return "error"


@settings(max_examples=400, deadline=None)
@given(st.lists(ELEMENT, max_size=8))
def test_the_fast_id_and_logprob_checks_agree_with_the_per_element_ones(values: list[Any]) -> None:
    from tailsieve.engines.transport import replies

    def outcome(fn: Any) -> Any:
        try:
            return fn()
        except ReplyError:
            return "error"

    ids = outcome(lambda: replies._ids(values, "ids"))
    assert ids == _per_element(lambda v: replies.count(v, "ids", replies.MAX_TOKEN_ID), values)
    lps = outcome(lambda: replies._logprobs({"logprobs": {"token_logprobs": values}}))
    assert lps == _per_element(replies._lp, values)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.integers(0, 40))
def test_a_run_of_19_digits_is_found_wherever_it_lies(noise: bytes, run: int) -> None:
    import re

    from tailsieve.engines.transport.replies import _long_digits
    payload = noise[: len(noise) // 2] + b"7" * run + noise[len(noise) // 2:]
    assert _long_digits(payload) == bool(re.search(rb"[0-9]{19}", payload))
