"""The price of the reply checks (issue 41's leftover: the checked hot path next to a bare parse).

Every generation reply a replica sends goes through `replies.loads` (strict JSON: orjson, NaN/Infinity refused, long
integers exact) and `replies.parse_full` (choices, finish reasons, token ids, log-probabilities finite and <= 0,
prompt ids, usage agreeing with the ids). This bench builds one vLLM completions reply of `--n` choices of
`--tokens` tokens each, with token ids, prompt token ids and per-token logprobs (vLLM's `return_token_ids` and
`logprobs=0` shape), and times, in one run and on the same bytes:

- `orjson.loads` alone (what any client pays to read the reply),
- `json.loads` alone (the standard library, for scale),
- `replies.loads` + `replies.parse_full` (what a TailSieve step pays per reply).

It prints microseconds per reply and per token (the median of `--repeats` timings of `--iters` parses each) and the
ratio checked / orjson; then the same with the tokens of a whole step (N·G samples) to put it next to a step's
seconds. Run: `python bench/bench_replies.py [--n 8] [--tokens 1024] [--prompt 256]` (a few seconds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson

from tailsieve.engines.transport.replies import loads, parse_full


def reply(n: int, tokens: int, prompt: int, seed: int = 0) -> bytes:
    """One vLLM completions reply: n choices, each with text, token ids, logprobs and the prompt's ids."""
    rng = np.random.default_rng(seed)
    choices = []
    for i in range(n):
        ids = rng.integers(0, 150_000, tokens).tolist()
        lps = (-rng.exponential(0.7, tokens)).round(6).tolist()
        choices.append({"index": i, "text": "x" * (4 * tokens), "finish_reason": "length", "token_ids": ids,
                        "prompt_token_ids": rng.integers(0, 150_000, prompt).tolist() if i == 0 else None,
                        "logprobs": {"tokens": ["x"] * tokens, "token_logprobs": lps,
                                     "top_logprobs": None, "text_offset": list(range(0, 4 * tokens, 4))}})
    prompt_ids = choices[0]["prompt_token_ids"]
    for c in choices:
        c["prompt_token_ids"] = prompt_ids
    body = {"id": "cmpl-1", "object": "text_completion", "model": "m", "choices": choices,
            "usage": {"prompt_tokens": prompt, "completion_tokens": n * tokens, "total_tokens": prompt + n * tokens}}
    return orjson.dumps(body)


def timed(fn: Callable[[], Any], iters: int, repeats: int) -> float:
    """Median seconds of one call over `repeats` timings of `iters` calls each."""
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        out.append((time.perf_counter() - t0) / iters)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=8, help="choices per reply (the group size G)")
    ap.add_argument("--tokens", type=int, default=1024, help="tokens per choice")
    ap.add_argument("--prompt", type=int, default=256, help="prompt tokens")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--groups", type=int, default=64, help="groups per step (N), for the per-step line")
    args = ap.parse_args()
    body = reply(args.n, args.tokens, args.prompt)
    checked = parse_full(loads(body), args.n, args.tokens, 0.0)
    assert len(checked.choices) == args.n and all(len(c.logprobs or ()) == args.tokens for c in checked.choices)
    rows = {
        "orjson.loads": timed(lambda: orjson.loads(body), args.iters, args.repeats),
        "json.loads": timed(lambda: json.loads(body), args.iters, args.repeats),
        "loads + parse_full (checked)": timed(lambda: parse_full(loads(body), args.n, args.tokens, 0.0),
                                              args.iters, args.repeats),
    }
    tokens = args.n * args.tokens
    print(f"one reply: {args.n} choices x {args.tokens} tokens, prompt {args.prompt} tokens, {len(body) / 1e3:.0f} kB")
    print(f"{'path':30s} {'us/reply':>10s} {'ns/token':>9s} {'x orjson':>9s}")
    base = rows["orjson.loads"]
    for name, s in rows.items():
        print(f"{name:30s} {s * 1e6:10.0f} {s * 1e9 / tokens:9.1f} {s / base:9.2f}")
    extra = rows["loads + parse_full (checked)"] - base
    print(f"checks beyond orjson: {extra * 1e6:.0f} us per reply; a step of N = {args.groups} such groups: "
          f"{extra * args.groups * 1e3:.1f} ms of CPU")


if __name__ == "__main__":
    main()
