"""The replica process of the launchers' default command: `python -m tailsieve.engines.launch.vllm_server
ARGS` requests the AMX tile-data permission where the CPU has AMX (`engines/launch/amx.py`), corrects the CPU build's
rejection-sampler fallback (`engines/launch/vllm_cpu_fix.py`), then runs vLLM's OpenAI
server (`vllm.entrypoints.openai.api_server`) with ARGS, in this same process, exactly as `python -m` would."""

from __future__ import annotations

import runpy
import sys

from tailsieve.engines.launch import vllm_cpu_fix
from tailsieve.engines.launch.amx import request_amx

VLLM_MODULE = "vllm.entrypoints.openai.api_server"


def main() -> None:
    """Request AMX (a refusal is one line on stderr, the server's log), then hand the process to vLLM."""
    permission = request_amx()
    if permission.line is not None:
        print(permission.line, file=sys.stderr, flush=True)
    vllm_cpu_fix.apply()  # speculative sampling on the CPU build: the expanded temperature is written (module doc)
    sys.argv = [VLLM_MODULE, *sys.argv[1:]]
    runpy.run_module(VLLM_MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
