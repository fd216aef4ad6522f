"""CPU price of vLLM's suffix drafter per running request per iteration (issue 52; the `draft_cpu_s` point of
src/tailsieve/data/suffix_measurements.json).

vLLM's `SuffixDecodingProposer.propose` (vllm/v1/spec_decode/suffix_decoding.py) does, for every running request and
every iteration, serially on the CPU: `add_active_response` with the tokens just sampled (they extend the request's
prompt tree and its slot in the global tree), then `speculate` on the request's last `max_tree_depth` tokens, which
searches the prompt tree and the global tree and keeps the better draft. This script times exactly those calls of
Arctic Inference's `SuffixDecodingCache` (the library vLLM imports) on a cache that holds a group's history: G cut
partial responses of the same prompt plus unrelated responses, then decodes one request token by token.

Run (needs `arctic-inference`, which the project's venvs do not hold; docs/speculative.md says how it was built):
    python bench/bench_suffix_cpu.py [--tokens 2000] [--depth 24] [--spec 16]
Prints the mean seconds per request-iteration and the same with the Python loop overhead of the proposer.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=2000, help="response length of the cached and decoded responses")
    ap.add_argument("--depth", type=int, default=24, help="suffix_decoding_max_tree_depth (vLLM's default 24)")
    ap.add_argument("--spec", type=int, default=16, help="num_speculative_tokens")
    ap.add_argument("--group", type=int, default=8, help="cut partial responses of the same prompt in the cache")
    args = ap.parse_args()
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    rng = np.random.default_rng(0)
    vocab = 32000
    prompt = rng.integers(0, vocab, 200).astype(np.int32)
    base = rng.integers(0, vocab, args.tokens).astype(np.int32)
    cache = SuffixDecodingCache(max_tree_depth=args.depth, max_cached_requests=10000)
    for i in range(args.group + 32):  # the group's cut work (mutated copies of one response) and unrelated responses
        resp = base.copy() if i < args.group else rng.integers(0, vocab, args.tokens).astype(np.int32)
        flip = rng.random(args.tokens) < 0.3
        resp[flip] = rng.integers(0, vocab, int(flip.sum()))
        cache.start_request(f"old{i}", prompt)
        cache.add_active_response(f"old{i}", resp.tolist())
        cache.stop_request(f"old{i}")
    target = base.copy()
    cache.start_request("new", prompt)
    context = list(prompt)
    n, t_calls, t0 = 0, 0.0, time.perf_counter()
    pos = 0
    while pos < args.tokens:
        a = time.perf_counter()
        draft = cache.speculate("new", np.asarray(context[-args.depth:], dtype=np.int32), max_spec_tokens=args.spec,
                                max_spec_factor=1.0, min_token_prob=0.1)
        accepted = 0
        for tok in draft.token_ids:
            if pos + accepted + 1 < args.tokens and tok == target[pos + accepted]:
                accepted += 1
            else:
                break
        new = target[pos:pos + accepted + 1].tolist()
        cache.add_active_response("new", new)
        t_calls += time.perf_counter() - a
        context += new
        pos += len(new)
        n += 1
    total = time.perf_counter() - t0
    print(f"iterations {n}, tokens {args.tokens}, mean tokens per iteration {args.tokens / n:.2f}")
    print(f"suffix cache calls: {t_calls / n * 1e6:.1f} us per request-iteration")
    print(f"with the loop around them: {total / n * 1e6:.1f} us per request-iteration")


if __name__ == "__main__":
    main()
