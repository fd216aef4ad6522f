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


def test_a_broken_step_contract_is_one_line_and_exit_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """An `InvariantError` (a step that lost a group) reaching the example's `main` is one `error:` line and exit 1,
    not a traceback: it is a `TailSieveError` (and still a `RuntimeError` for older callers)."""
    import importlib.util

    from tailsieve.errors import TailSieveError
    from tailsieve.policy.step import InvariantError

    assert issubclass(InvariantError, TailSieveError) and issubclass(InvariantError, RuntimeError)
    spec = importlib.util.spec_from_file_location("grpo_train_under_test", TRAIN)
    assert spec is not None and spec.loader is not None
    monkeypatch.syspath_prepend(str(TRAIN.parent))
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look their module up
    spec.loader.exec_module(module)

    def broken(a: object) -> list[object]:
        raise InvariantError("step 3: 3 complete groups, expected exactly 4")

    monkeypatch.setattr(module, "run", broken)
    # the example checks its extras first (tests/test_install_lines.py tests that line): here they count as present,
    # so the step-contract path is reached in a venv with only '.[dev]' too
    monkeypatch.setattr(module, "missing_modules", lambda names: [])
    assert module.main(["--workdir", str(tmp_path / "w")]) == 1
    err = capsys.readouterr().err
    assert err == "error: step 3: 3 complete groups, expected exactly 4\n"
