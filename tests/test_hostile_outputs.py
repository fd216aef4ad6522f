"""Issue 41, output data: one writer per output folder, outputs that are regular files, appends that recover.

Generated classes:
- `TARGETS` x `WRITERS`: an existing output that is a symlink (to a file, to /dev/null, dangling), a FIFO, or the
  wrong kind (a folder where a file goes, a file where a folder goes) is refused in one line by every writer, and
  left exactly as it was; a missing or regular target is written as a regular file (`ACCEPTED`).
- `CUTS` x BOM x batch file: a steps.jsonl whose last line a killed or failing writer left unfinished resumes with
  no hand edit, the unfinished bytes moved aside under uncommitted/ and the user told in one line.
- `SIGNALS`: SIGTERM, SIGHUP and SIGINT end a running rollout with one line and exit 128 + the signal; it resumes.
- Write errors (EFBIG from RLIMIT_FSIZE, in a subprocess): one line naming the file and what was kept.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from engine_fake import FakeServer, small_rollout, write_prompts
from hostile_harness import run_case
from tailsieve.outputs import LOCK_NAME, OutputError, OutputLock

SRC = str(Path(__file__).resolve().parents[1] / "src")
ENV = {**os.environ, "PYTHONPATH": SRC + os.pathsep + str(Path(__file__).parent),
       "PYTHONDONTWRITEBYTECODE": "1"}


@pytest.fixture(scope="module")
def servers() -> Iterator[list[FakeServer]]:
    with FakeServer() as a, FakeServer() as b:
        yield [a, b]


prompts = write_prompts
rollout = small_rollout


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------------- the lock, used directly


@pytest.mark.parametrize("folder", [True, False], ids=["folder", "file"])
def test_a_second_writer_is_refused_naming_the_holder_until_the_first_releases(tmp_path: Path, folder: bool) -> None:
    target = tmp_path / ("out" if folder else "curve.json")
    if folder:
        target.mkdir()
    first = OutputLock(target, "rollout", folder=folder).acquire()
    for attempt in (lambda: OutputLock(target, "profile", folder=folder).acquire(),
                    lambda: OutputLock(target, "profile", folder=folder).check()):
        with pytest.raises(OutputError) as err:
            attempt()
        msg = str(err.value)
        assert "\n" not in msg and msg.startswith(f"{target} is being written by another run (tailsieve rollout, "
                                                  f"pid {os.getpid()} on host ")
        assert msg.endswith("; wait for it to end or choose another --out")
    first.release()
    with OutputLock(target, "profile", folder=folder) as second:
        assert second.held
        assert json.loads(second.path.read_text())["command"] == "profile"
    assert not second.held and second.path.exists()  # released; the file stays (removing it would race)


def test_check_touches_nothing_and_a_dead_holder_never_blocks(tmp_path: Path) -> None:
    OutputLock(tmp_path, "rollout", folder=True).check()
    assert list(tmp_path.iterdir()) == []  # no lock file made by a check
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from tailsieve.outputs import OutputLock
        lock = OutputLock(Path({str(tmp_path)!r}), "rollout", folder=True).acquire()
        print("held", flush=True)
        time.sleep(120)
        """)], stdout=subprocess.PIPE, env=ENV)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"held"
        with pytest.raises(OutputError, match=f"pid {holder.pid} on host "):
            OutputLock(tmp_path, "rollout", folder=True).acquire()
        holder.kill()  # SIGKILL: no clean-up ran, the lock file still names the dead holder
        holder.wait()
        assert f'"pid": {holder.pid}' in (tmp_path / LOCK_NAME).read_text()
        with OutputLock(tmp_path, "rollout", folder=True):
            pass
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


# ---------------------------------------------------------------------- two rollouts into one --out (the CLI)


@pytest.fixture
def slow_servers(servers: list[FakeServer]) -> Iterator[list[FakeServer]]:
    """~0.5 s a step: a run is still writing while the test acts on it."""
    old = [s.tpot_s for s in servers]
    for s in servers:
        s.tpot_s = 0.02
    yield servers
    for s, t in zip(servers, old, strict=True):
        s.tpot_s = t


def start(argv: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "tailsieve", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=ENV)


def wait_for_steps(folder: Path, n: int, proc: subprocess.Popen[bytes], timeout_s: float = 180) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and proc.poll() is None:
        state = folder / "state.json"
        if state.exists() and json.loads(state.read_text())["router"]["step"] >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"no step {n} in {folder} (exit {proc.poll()})")


def test_a_second_rollout_into_a_running_out_is_refused_and_the_first_loses_nothing(
        slow_servers: list[FakeServer], tmp_path: Path) -> None:
    """Issue 41: a second run started while the first writes (same policy, another policy, `--resume`) is refused
    in one line naming the first run's pid; the first run completes with every step committed."""
    prompts(tmp_path)
    first = start(rollout(slow_servers, tmp_path, 6))
    try:
        wait_for_steps(tmp_path / "out" / "static", 1, first)
        for extra, policy in (((), "static"), ((), "uniform"), (("--resume",), "static")):
            rc, err = run_case("two writers", rollout(slow_servers, tmp_path, 8, *extra, policy=policy), tmp_path)
            assert rc == 1 and f"is being written by another run (tailsieve rollout, pid {first.pid} on host " in err
        assert first.wait(timeout=120) == 0, first.stderr.read() if first.stderr else ""
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    folder = tmp_path / "out" / "static"
    steps = [json.loads(x)["step"] for x in (folder / "steps.jsonl").read_text().splitlines()]
    assert steps == list(range(6)) and not (folder / "uncommitted").exists()
    assert json.loads((folder / "state.json").read_text())["router"]["step"] == 6
    assert list(json.loads((tmp_path / "out" / "report.json").read_text())["policies"]) == ["static"]


# ------------------------------------------------------------------------------ outputs are regular files or refused

FileMaker = Callable[[Path], None]


def _link(to: str | None) -> FileMaker:
    def make(p: Path) -> None:
        real = p.parent / "real.json"
        real.write_text('{"kept": true}\n')
        p.symlink_to(to or str(real))
    return make


TARGETS: dict[str, FileMaker] = {
    "symlink to a regular file": _link(None),
    "symlink to a folder": lambda p: (p.parent / "real").mkdir() or p.symlink_to(p.parent / "real"),
    "symlink to /dev/null": _link("/dev/null"),
    "dangling symlink": _link("/nonexistent/tailsieve-target"),
    "FIFO": lambda p: os.mkfifo(p),
    "wrong kind": lambda p: p.mkdir() if p.suffix else p.write_text("x\n"),  # folder for a file, file for a folder
}
WRITERS: dict[str, Callable[[str], list[str]]] = {
    "profile --out": lambda t: ["profile", "--endpoint", "http://127.0.0.1:1", "--out", t],
    "simulate --plot": lambda t: ["simulate", "--steps", "2", "--plot", t],
    "analyze --plot": lambda t: ["analyze", "synthetic-math", "--prompts", "8", "--plot", t],
    "oracle --plot": lambda t: ["oracle", "--sample", "8", "--plot", t],
    "rollout --out": lambda t: ["rollout", "--endpoints", "http://127.0.0.1:1", "--prompts", "P", "--steps", "1",
                                "--groups", "2", "--group-size", "1", "--policy", "uniform", "--out", t],
    "launch --out": lambda t: ["launch", "--model", "m", "--dry-run", "--out", t],
}
FILE_WRITERS = ("profile --out", "simulate --plot", "analyze --plot", "oracle --plot")
CASES = [(w, t) for w in WRITERS for t in TARGETS]


def _describe(p: Path) -> tuple[int, str | None]:
    st = os.lstat(p)
    return stat.S_IFMT(st.st_mode), os.readlink(p) if stat.S_ISLNK(st.st_mode) else None


@pytest.mark.parametrize(("writer", "target"), CASES, ids=[f"{w}: {t}" for w, t in CASES])
def test_an_output_that_is_not_a_regular_file_is_refused_and_left_as_it_was(tmp_path: Path, writer: str,
                                                                           target: str) -> None:
    path = tmp_path / ("t.png" if writer in FILE_WRITERS else "out")
    if writer == "profile --out":
        path = tmp_path / "t.json"
    TARGETS[target](path)
    argv = [str(prompts(tmp_path)) if a == "P" else a for a in WRITERS[writer](str(path))]
    before, kind = snapshot(tmp_path), _describe(path)
    rc, err = run_case("output targets", argv, tmp_path)
    assert rc != 0 and str(path) in err, err
    assert _describe(path) == kind and snapshot(tmp_path) == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp or lock file left


ACCEPTED = [(w, t) for w in ("profile --out", "simulate --plot") for t in ("missing", "regular file")]


@pytest.mark.parametrize(("writer", "target"), ACCEPTED, ids=[f"{w}: {t}" for w, t in ACCEPTED])
def test_a_missing_or_regular_output_is_written_as_a_regular_file(servers: list[FakeServer], tmp_path: Path,
                                                                  writer: str, target: str) -> None:
    path = tmp_path / ("t.json" if writer == "profile --out" else "t.png")
    if target == "regular file":
        path.write_text("old\n")
    argv = WRITERS[writer](str(path))
    if writer == "profile --out":
        argv = ["profile", "--endpoint", servers[0].url, "--batches", "1,2", "--max-tokens", "4", "--contexts", "0",
                "--out", str(path)]
    assert run_case("output targets", argv, tmp_path)[0] == 0
    assert stat.S_ISREG(os.lstat(path).st_mode) and path.read_bytes() != b"old\n"
    leftovers = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("."))
    assert leftovers == ([f".{path.name}.lock"] if writer == "profile --out" else [])  # no temp file


# ------------------------------------------------------------------------------- write errors name the file

FSIZE_SCRIPT = """
import os, resource, sys
from pathlib import Path
from tailsieve.outputs import OutputError, append_line, write_atomic
path, kind = Path(sys.argv[1]), sys.argv[2]
resource.setrlimit(resource.RLIMIT_FSIZE, (200, 200))
try:
    if kind == "append":
        append_line(path, "y" * 150, "step log")
    else:
        write_atomic(path, "z" * 500, "report")
except OutputError as exc:
    print(exc)
"""


@pytest.mark.parametrize("case", ["append", "replace", "new"])
def test_a_file_size_limit_is_one_line_naming_the_file_and_keeps_what_was_there(tmp_path: Path, case: str) -> None:
    path = tmp_path / "f.jsonl"
    if case != "new":
        path.write_text("x" * 100 + "\n")
    before = path.read_bytes() if path.exists() else None
    out = subprocess.run([sys.executable, "-c", FSIZE_SCRIPT, str(path), case], capture_output=True, text=True,
                         env=ENV, timeout=60, check=True).stdout.strip()
    what = "step log" if case == "append" else "report"
    kept = {"append": "the file is kept as it was, ending with its last complete line",
            "replace": "the previous f.jsonl is unchanged", "new": "nothing was written"}[case]
    assert out == f"cannot write {what} {path}: File too large; {kept}"
    assert (path.read_bytes() if path.exists() else None) == before
    assert [p.name for p in tmp_path.iterdir()] == ([] if case == "new" else ["f.jsonl"])  # no temp file left


def test_a_failed_append_to_steps_jsonl_is_undone_and_the_run_resumes(servers: list[FakeServer],
                                                                      tmp_path: Path) -> None:
    """Issue 41: a file-size limit hit mid-append left a partial line, an error not naming the file, and a folder
    `--resume` refused until edited by hand."""
    prompts(tmp_path)
    assert run_case("efbig", rollout(servers, tmp_path, 2), tmp_path)[0] == 0
    folder = tmp_path / "out" / "static"
    size = (folder / "steps.jsonl").stat().st_size
    limit = size + 200  # room for the next batch file (checked), not for the next step line
    before = (folder / "steps.jsonl").read_bytes()
    script = (f"import resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit})); "
              f"from tailsieve.cli import main; sys.exit(main({rollout(servers, tmp_path, 3, '--resume')!r}))")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=ENV, timeout=120)
    assert (folder / "batch-00002.jsonl").stat().st_size < limit
    assert proc.returncode == 1 and proc.stderr.splitlines() == [
        f"tailsieve rollout: error: cannot write step log {folder / 'steps.jsonl'}: File too large; the file is kept "
        "as it was, ending with its last complete line"]
    assert (folder / "steps.jsonl").read_bytes() == before
    rc, err = run_case("efbig", rollout(servers, tmp_path, 3, "--resume"), tmp_path)
    assert rc == 0 and f"{folder}: step 2 was not committed by the run that wrote it (batch-00002.jsonl)" in err
    assert (folder / "uncommitted" / "step-00002" / "batch-00002.jsonl").exists()
    assert [json.loads(x)["step"] for x in (folder / "steps.jsonl").read_text().splitlines()] == [0, 1, 2]


# --------------------------------------------------------------------------- an unfinished last line resumes

CUTS = {"1 byte": 1, "10 bytes": 10, "half": 0.5, "all but 1": -1, "whole line, no newline": 0}


@pytest.fixture(scope="module")
def base(servers: list[FakeServer], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of 3 steps, and beside it (state-2.json) the state its run saved after step 2."""
    root = tmp_path_factory.mktemp("unfinished-base")
    prompts(root)
    assert run_case("unfinished", rollout(servers, root, 2), root)[0] == 0
    shutil.copy(root / "out" / "static" / "state.json", root / "state-2.json")
    assert run_case("unfinished", rollout(servers, root, 3, "--resume"), root)[0] == 0
    return root


UNFINISHED = [(c, bom, batch) for c in CUTS for bom in (False, True) for batch in (False, True)]


def _cut(line: str, how: float) -> str:
    n = len(line)
    return line[:{1: 1, 10: 10, 0.5: n // 2, -1: n - 1, 0: n}[how]]


@pytest.mark.parametrize(("cut", "bom", "batch"), UNFINISHED,
                         ids=[f"{c}, {'BOM' if b else 'no BOM'}, {'batch' if f else 'no batch'}"
                              for c, b, f in UNFINISHED])
def test_an_unfinished_last_step_line_is_moved_aside_and_the_step_rerun(servers: list[FakeServer], base: Path,
                                                                        tmp_path: Path, cut: str, bom: bool,
                                                                        batch: bool) -> None:
    """Issue 41: a run killed (or out of space) mid-append of step 2's line, its state at step 2: `--resume`
    refused with `line 3: invalid JSON` until the file was edited by hand; now it needs no edit."""
    root = tmp_path / "r"
    shutil.copytree(base, root)
    folder = root / "out" / "static"
    lines = (folder / "steps.jsonl").read_text().splitlines()
    partial = _cut(lines[2], CUTS[cut])
    (folder / "steps.jsonl").write_bytes(("\ufeff" if bom else "").encode()
                                         + "".join(x + "\n" for x in lines[:2]).encode() + partial.encode())
    shutil.copy(root / "state-2.json", folder / "state.json")
    if not batch:
        (folder / "batch-00002.jsonl").unlink()
    rc, err = run_case("unfinished", rollout(servers, root, 3, "--resume"), root)
    assert rc == 0, err
    found = ("its line in steps.jsonl" if cut == "whole line, no newline"
             else "an unfinished last line in steps.jsonl (line 3")
    assert f"{folder}: step 2 was not committed by the run that wrote it ({found}" in err
    aside = folder / "uncommitted" / "step-00002"
    assert (aside / "steps.jsonl").read_text() == partial
    assert (aside / "batch-00002.jsonl").exists() == batch
    new = (folder / "steps.jsonl").read_text().splitlines()
    assert new[:2] == lines[:2] and [json.loads(x)["step"] for x in new] == [0, 1, 2]


def test_a_committed_last_line_without_its_newline_resumes_in_place(servers: list[FakeServer], base: Path,
                                                                    tmp_path: Path) -> None:
    """The newline of the last committed line lost (the state is at step 3): the next line starts on its own line."""
    root = tmp_path / "r"
    shutil.copytree(base, root)
    steps = root / "out" / "static" / "steps.jsonl"
    steps.write_bytes(steps.read_bytes().rstrip(b"\n"))
    assert run_case("unfinished", rollout(servers, root, 4, "--resume"), root)[0] == 0
    assert [json.loads(x)["step"] for x in steps.read_text().splitlines()] == [0, 1, 2, 3]
    assert not (root / "out" / "static" / "uncommitted").exists()


# ----------------------------------------------------------------------------- SIGTERM / SIGHUP like Ctrl-C

SIGNALS = [signal.SIGTERM, signal.SIGHUP, signal.SIGINT]


@pytest.mark.parametrize("sig", SIGNALS, ids=[s.name for s in SIGNALS])
def test_a_signal_ends_rollout_in_one_line_with_128_plus_the_signal_and_it_resumes(
        slow_servers: list[FakeServer], tmp_path: Path, sig: signal.Signals) -> None:
    """Issue 41: SIGTERM and SIGHUP ended `rollout` without a word."""
    prompts(tmp_path)
    proc = start(rollout(slow_servers, tmp_path, 50))
    try:
        wait_for_steps(tmp_path / "out" / "static", 1, proc)
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 128 + sig
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read().decode() if proc.stderr else ""
    how = "" if sig == signal.SIGINT else f" by {sig.name}"
    assert err.splitlines()[-1] == (f"tailsieve rollout: interrupted{how}; the completed steps are kept in "
                                    f"{tmp_path / 'out'} (rollout --resume continues)")
    assert "Traceback" not in err
    done = json.loads((tmp_path / "out" / "static" / "state.json").read_text())["router"]["step"]
    for s in slow_servers:
        s.tpot_s = 0.0005
    assert run_case("signals", rollout(slow_servers, tmp_path, done + 1, "--resume"), tmp_path)[0] == 0
