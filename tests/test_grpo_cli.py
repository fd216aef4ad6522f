"""The CPU GRPO example's command line (examples/grpo_cpu/train.py) without any extra: every bad flag is one line
and exit 2 before a model is built or a server starts (torch, transformers and vLLM are imported only after)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TRAIN = Path(__file__).resolve().parents[1] / "examples" / "grpo_cpu" / "train.py"


@pytest.mark.parametrize(("argv", "message"), [
    (["--plot", "x.txt"], "--plot x.txt: use a .png, .pdf or .svg file name"),
    (["--plot", "/no/such/dir/p.png"], "--plot /no/such/dir/p.png: folder /no/such/dir does not exist"),
    (["--stall-timeout", "0"], "--stall-timeout must be a positive number of seconds, got 0.0"),
    (["--stall-timeout", "x"], "argument --stall-timeout: invalid float value: 'x'"),
    (["--steps", "0"], "--steps must be >= 1, got 0"),
    (["--policy", "static"], "--policy static needs --q and --m"),
    (["--policy", "nope"], "argument --policy: invalid choice: 'nope'"),
])
def test_bad_flags_are_one_line_before_anything_starts(argv: list[str], message: str, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(TRAIN), *argv, "--workdir", str(tmp_path / "w")], capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=str(TRAIN.parents[2] / "src")), timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(f"train.py: error: {message}") and proc.stderr.count("\n") == 1
    assert not (tmp_path / "w").exists()  # no model built, no server started


def test_stall_timeout_is_a_flag_with_the_engines_default() -> None:
    proc = subprocess.run([sys.executable, str(TRAIN), "--help"], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(TRAIN.parents[2] / "src"), COLUMNS="200"), timeout=120)
    assert proc.returncode == 0 and "--stall-timeout S" in proc.stdout and "(default: 60.0;" in proc.stdout
