"""What the launcher tests share (`test_launch*.py`, `test_launcher_seam.py`): the fake server process
(tests/fake_vllm_proc.py), a launch config on the fake, the launch file the CLI reads, and the check that a process
group is gone. Their fixtures (`model`, `record`, `running`) are in conftest.py."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from tailsieve.engines.launch.config import LaunchConfig, PoolEngine
from tailsieve.model.speculative import SpecConfig, SpecMethod

FAKE = (sys.executable, str(Path(__file__).resolve().parent / "fake_vllm_proc.py"))
NGRAM = PoolEngine(SpecConfig(SpecMethod.NGRAM, 3), (("prompt_lookup_max", 4),))


def fake_cfg(model: Path, **kw: object) -> LaunchConfig:
    base = LaunchConfig(model=str(model), replicas=2, command=FAKE, startup_timeout_s=30, grace_s=3,
                        places=("0", "1"), memory=1)
    return replace(base, **kw)  # type: ignore[arg-type]


def gone(pid: int, timeout_s: float = 5.0) -> bool:
    """The process group of `pid` has no process left (after a grace of up to `timeout_s` for reaping)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def write_cfg(tmp_path: Path, model: Path, extra: str = "") -> Path:
    path = tmp_path / "launch.toml"
    cmd = json.dumps(list(FAKE))
    path.write_text(f'[spec.tail]\nmethod = "ngram"\ntokens = 3\n[launch]\nmodel = "{model}"\ncommand = {cmd}\n'
                    f'cores = ["0", "1"]\nstartup_timeout_s = 30.0\ngrace_s = 3.0\n{extra}')
    return path
