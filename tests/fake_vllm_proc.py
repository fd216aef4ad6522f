"""Stand-in for `python -m vllm.entrypoints.openai.api_server` in launcher tests (run as a script): takes the flags
tailsieve passes, records its argv and placement environment (one JSON line appended to $FAKE_VLLM_RECORD), then
serves the fake OpenAI API of engine_fake.py until SIGTERM. Test-only flags: --fake-crash (exit during start-up
with a server-like error), --fake-boot S (start-up delay), --fake-ignore-term (needs SIGKILL), --fake-child (a
child process in the same group, like vLLM's engine core), --fake-crash-if PATH (crash during start-up when PATH
exists: a restart that fails)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_fake import FakeServer

ENV_KEYS = ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE", "CUDA_VISIBLE_DEVICES", "HF_HUB_OFFLINE", "TMPDIR")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--speculative-config")
    p.add_argument("--fake-crash", action="store_true")
    p.add_argument("--fake-boot", type=float, default=0.0)
    p.add_argument("--fake-ignore-term", action="store_true")
    p.add_argument("--fake-child", action="store_true")
    p.add_argument("--fake-crash-if", help="crash during start-up when this file exists")
    args, _ = p.parse_known_args()
    record = os.environ.get("FAKE_VLLM_RECORD")
    if record:
        row = {"argv": sys.argv[1:], "pid": os.getpid(), "port": args.port,
               "env": {k: os.environ[k] for k in ENV_KEYS if k in os.environ}}
        with open(record, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")
    print("INFO fake vLLM starting", flush=True)
    if args.fake_crash or (args.fake_crash_if and os.path.exists(args.fake_crash_if)):
        time.sleep(0.3)
        print("Traceback (most recent call last):\nValueError: fake engine failed to start", file=sys.stderr)
        return 1
    if args.fake_ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"]) if args.fake_child else None
    time.sleep(args.fake_boot)
    server = FakeServer(tpot_s=0.0002, port=args.port).start()
    stop = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    if not args.fake_ignore_term:
        signal.signal(signal.SIGTERM, on_term)
    while not stop:
        time.sleep(0.05)
    server.stop()
    if child is not None:
        child.terminate()
        child.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
