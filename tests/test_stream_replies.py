"""A streamed reply folded into its `Completion` (`engines/transport/stream_replies.py`), and error events inside a
stream: the request's fault for 4xx, the replica's otherwise (the property test over generated streams is in
test_reply_properties.py)."""

from __future__ import annotations

import pytest

from tailsieve.engines.transport.replies import ReplyError, parse_chunk
from tailsieve.engines.transport.stream_replies import StreamAcc, raise_stream_error
from tailsieve.engines.transport.types import FaultKind, ReplicaFault, RequestRejected

CAP = 100


def event(index: int, text: str, ids: list[int], finish: str | None = None) -> dict[str, object]:
    return {"choices": [{"index": index, "text": text, "token_ids": ids, "finish_reason": finish}]}


def test_two_choices_fold_into_one_completion_with_progress_along_the_way() -> None:
    progress = [0, 0]
    acc = StreamAcc(2, CAP, progress)
    for obj, seen in [(event(0, "ab", [1, 2]), [2, 0]), (event(1, "x", [7]), [2, 1]),
                      (event(0, "c", [3], "stop"), [3, 1]), (event(1, "", [], "length"), [3, 1])]:
        acc.add(parse_chunk(obj, 2, CAP))
        assert progress == seen
    comp = acc.result(True, 0.5, 0.1)
    assert [(c.index, c.text, c.tokens, c.finish_reason, c.token_ids) for c in comp.choices] == [
        (0, "abc", 3, "stop", (1, 2, 3)), (1, "x", 1, "length", (7,))]
    assert (comp.latency_s, comp.ttft_s) == (0.5, 0.1)


def test_an_unfinished_choice_is_a_bad_reply_after_done_and_a_dropped_connection_without() -> None:
    acc = StreamAcc(2, CAP, [0, 0])
    acc.add(parse_chunk(event(0, "a", [1], "stop"), 2, CAP))
    with pytest.raises(ReplyError, match=r"\[DONE\] before choice 1 finished \(1 of 2 unfinished\)"):
        acc.result(True, 0.1, None)
    with pytest.raises(EOFError):
        acc.result(False, 0.1, None)


@pytest.mark.parametrize("code", [400, 404, 422])
def test_a_4xx_error_event_is_the_requests_fault(code: int) -> None:
    with pytest.raises(RequestRejected, match=rf"^http://r0: HTTP {code} \(in stream\): too long$"):
        raise_stream_error("http://r0", {"code": code, "message": "too\n  long"})


@pytest.mark.parametrize("err", [{"code": 500, "message": "boom"}, {"code": 408, "message": "boom"},
                                 {"code": 429, "message": "boom"}, {"code": "n/a", "message": "boom"}, "boom"])
def test_any_other_error_event_is_the_replicas_fault(err: object) -> None:
    with pytest.raises(ReplicaFault) as info:
        raise_stream_error("http://r0", err)
    assert info.value.kind is FaultKind.HTTP_5XX and "error in stream: boom" in str(info.value)


def test_an_error_message_is_one_line_at_most_200_characters() -> None:
    with pytest.raises(ReplicaFault) as info:
        raise_stream_error("http://r0", {"code": 503, "message": "x\n" * 500})
    text = str(info.value)
    assert "\n" not in text and text.count("x") <= 200
