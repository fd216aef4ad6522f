"""The cost of redaction on a step's hot path (issue 49: under 2% of a 64-group step's CPU time).

A 64-group step of G = 8 samples of 1,024 tokens, one request per sample (the default split request mode): its CPU
floor here is the reply checks every sample pays (`replies.loads` + `replies.parse_full` of 512 one-choice replies
with token ids and logprobs; the router, controller and transport come on top, so the ratios below are upper
bounds). Against it, in the same run:

- a quiet step: the lines a step prints or logs about user or server content (the step line, a note, a warning)
  through `redact.line`;
- a faulty step: every one of the 512 requests answered once with an HTTP 400 error body (a vLLM-shaped JSON error,
  the request's text echoed) that is redacted and clipped as `reply_bounds.error_message` does, before its retry;
- a hostile step: the same, each body 64 KiB (the most an error body is read) of the slowest text found for the
  scanner (`secret_` runs), what a misbehaving server can make a step pay at worst.

Run: `python bench/bench_redact.py` (about a minute); prints milliseconds per step and the ratio to the step's CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench_replies import reply
from tailsieve.engines.transport.replies import loads, parse_full
from tailsieve.redact import clip, line, redact

ERROR_BODY_BYTES = 64 << 10


def timed(fn: Callable[[], Any], repeats: int) -> float:
    """Median seconds of `repeats` calls."""
    out = []
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        out.append(time.process_time() - t0)
    return statistics.median(out)


def error_body(i: int) -> str:
    """A vLLM-shaped 400 reply that echoes the request."""
    return json.dumps({"object": "error", "type": "BadRequestError", "code": 400, "param": None,
                       "message": f"This model's maximum context length is 4096 tokens. However, you requested "
                                  f"{5000 + i} tokens (3000 in the messages, 2000 in the completion). Please reduce "
                                  f"the length of the messages or completion. prompt: 'Solve: the sum of {i} and "
                                  f"{i + 1}'"})


def error_message(body: str) -> str:
    """What `reply_bounds.error_message` does with a body: redact, parse, one line, clip."""
    text = redact(body[:ERROR_BODY_BYTES])
    try:
        obj = json.loads(text)
        msg = str(obj.get("message", obj)) if isinstance(obj, dict) else text
    except ValueError:
        msg = text
    return clip(" ".join(msg.split()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=64)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    n = args.groups * args.group_size
    bodies = [reply(1, args.tokens, 256, seed=i % 16) for i in range(n)]
    step = timed(lambda: [parse_full(loads(b), 1, args.tokens, 0.0) for b in bodies], args.repeats)
    lines = ["step 12: 64 groups, q=6 m=1, makespan 41.20 s, 3 redrawn, tail pool 1 replica",
             "tailsieve rollout: http://10.0.0.7:8000 answered 400 (max_tokens is too large) on request 311; retried",
             "tailsieve rollout: warning: prompts.jsonl has 80 prompts but a step draws N + E = 71 groups"]
    quiet = timed(lambda: [line(x) for x in lines], max(args.repeats, 50))
    errors = [error_body(i) for i in range(n)]
    faulty = timed(lambda: [error_message(b) for b in errors], args.repeats)
    hostile_body = ("secret_" * (ERROR_BODY_BYTES // 7 + 1))[:ERROR_BODY_BYTES]
    per_hostile = timed(lambda: error_message(hostile_body), args.repeats)
    rows = [("quiet step (3 printed lines)", quiet), (f"faulty step ({n} error bodies)", faulty),
            (f"hostile step ({n} x 64 KiB bodies)", per_hostile * n)]
    print(f"step: N = {args.groups} groups x G = {args.group_size} samples x {args.tokens} tokens; "
          f"reply checks {step * 1e3:.1f} ms of CPU (the step's floor)")
    print(f"{'redaction on the hot path':38s} {'ms/step':>9s} {'x step CPU':>11s}")
    for name, s in rows:
        print(f"{name:38s} {s * 1e3:9.3f} {s / step:11.4%}")
    print(f"one hostile 64 KiB body: {per_hostile * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
