"""A disk that fails mid-run (read-only remount, full, permission lost, I/O error): faults injected into the real
write path (`tailsieve.outputs` over the real files; the suite runs as root, so permission bits alone cannot make a
folder read-only).

Generated classes:
- `ERRNOS` x the three writes of a rollout step (batch file, step line, state; `runner.RunFiles.write`, in that
  order): the run stops with one line naming the file and what was kept, exit 1; the completed steps' files are
  byte for byte as they were; `--resume` on a healthy disk moves what step 2 wrote before the fault under
  uncommitted/, says so in one line, and finishes the run, every prompt delivered exactly once.
- `ERRNOS` x the system call that fails x the writer (`write_atomic` over an existing file or a new one,
  `append_line`): the exact line, the file unchanged, no temp file left.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from engine_fake import FakeServer, small_rollout, write_prompts
from hostile_harness import run_case
from tailsieve.outputs import OutputError, append_line, write_atomic

ERRNOS = {"read-only": errno.EROFS, "full": errno.ENOSPC, "permission": errno.EACCES, "I/O error": errno.EIO}


@contextmanager
def failing(call: str, when: Callable[[str], bool], code: int) -> Iterator[None]:
    """`os.<call>` raises OSError(code) where `when(path)` holds (the path written: the destination of a rename,
    the file of a descriptor for write and fsync, the path opened); every other call runs as usual."""
    real: dict[str, Any] = {name: getattr(os, name) for name in ("open", "write", "fsync", "replace", "close")}
    paths: dict[int, str] = {}

    def fail(path: str) -> None:
        raise OSError(code, os.strerror(code), path)

    def open_(path: Any, flags: int, *args: Any, **kw: Any) -> int:
        if call == "open" and when(os.fspath(path)):
            fail(os.fspath(path))
        fd: int = real["open"](path, flags, *args, **kw)
        paths[fd] = os.fspath(path)
        return fd

    def on_fd(name: str) -> Callable[..., Any]:
        def wrapped(fd: int, *args: Any) -> Any:
            if call == name and when(paths.get(fd, "")):
                fail(paths[fd])
            return real[name](fd, *args)
        return wrapped

    def replace(src: Any, dst: Any, **kw: Any) -> None:
        if call == "replace" and when(os.fspath(dst)):
            fail(os.fspath(dst))
        real["replace"](src, dst, **kw)

    def close(fd: int) -> None:
        paths.pop(fd, None)
        real["close"](fd)

    patched = {"open": open_, "write": on_fd("write"), "fsync": on_fd("fsync"), "replace": replace, "close": close}
    for name, fn in patched.items():
        setattr(os, name, fn)
    try:
        yield
    finally:
        for name, fn in real.items():
            setattr(os, name, fn)


# ------------------------------------------------------------------------------------------- the writers directly

WRITER_CALLS = [("append", "open"), ("append", "write"), ("append", "fsync"),
                ("replace", "open"), ("replace", "fsync"), ("replace", "replace"),
                ("new", "open"), ("new", "fsync"), ("new", "replace")]
DIRECT = [(e, w, c) for e in ERRNOS for w, c in WRITER_CALLS]


@pytest.mark.parametrize(("fault", "writer", "call"), DIRECT, ids=[f"{e}-{w}-{c}" for e, w, c in DIRECT])
def test_a_failing_disk_is_one_line_and_the_file_is_unchanged(tmp_path: Path, fault: str, writer: str,
                                                               call: str) -> None:
    path = tmp_path / "f.jsonl"
    if writer != "new":
        path.write_text('{"step": 0}\n')
    before = path.read_bytes() if path.exists() else None
    with failing(call, lambda p: Path(p).parent == tmp_path, ERRNOS[fault]), pytest.raises(OutputError) as err:
        if writer == "append":
            append_line(path, '{"step": 1}', "step log")
        else:
            write_atomic(path, '{"state": 2}', "rollout state")
    kept = {"append": "the file is unchanged" if call == "open" else
            "the file is kept as it was, ending with its last complete line",
            "replace": "the previous f.jsonl is unchanged", "new": "nothing was written"}[writer]
    what = "step log" if writer == "append" else "rollout state"
    assert str(err.value) == f"cannot write {what} {path}: {os.strerror(ERRNOS[fault])}; {kept}"
    assert (path.read_bytes() if path.exists() else None) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ([] if writer == "new" else ["f.jsonl"])  # no temp file


# ------------------------------------------------------------------------------------------ a rollout's writes

@pytest.fixture(scope="module")
def servers() -> Iterator[list[FakeServer]]:
    with FakeServer() as a, FakeServer() as b:
        yield [a, b]


rollout = small_rollout


STEP_WRITES = {  # the write of step 2 that fails: (what the error names, file, system call, what was kept)
    "batch file": ("batch file", "batch-00002.jsonl", "replace", "nothing was written"),
    "step line": ("step log", "steps.jsonl", "write", "the file is kept as it was, ending with its last complete line"),
    "state": ("rollout state", "state.json", "replace", "the previous state.json is unchanged"),
}
SET_ASIDE = {  # what the resumed run moves under uncommitted/step-00002 (the files step 2 wrote before the fault)
    "batch file": [], "step line": ["batch-00002.jsonl"], "state": ["batch-00002.jsonl", "steps.jsonl"]}
ROLLOUT = [(e, w) for e in ERRNOS for w in STEP_WRITES]


@pytest.mark.parametrize(("fault", "write"), ROLLOUT, ids=[f"{e}-{w}" for e, w in ROLLOUT])
def test_a_disk_failing_mid_run_stops_in_one_line_keeps_the_steps_and_resumes(
        servers: list[FakeServer], tmp_path: Path, fault: str, write: str) -> None:
    write_prompts(tmp_path)
    assert run_case("disk faults", rollout(servers, tmp_path, 2), tmp_path)[0] == 0
    folder = tmp_path / "out" / "static"
    kept_files = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and p.name != "state.json"}
    what, name, call, kept = STEP_WRITES[write]
    with failing(call, lambda p: Path(p).name == name and Path(p).parent == folder, ERRNOS[fault]):
        rc, err = run_case("disk faults", rollout(servers, tmp_path, 3, "--resume"), tmp_path)
    assert rc == 1 and err.splitlines()[-1] == (f"tailsieve rollout: error: cannot write {what} {folder / name}: "
                                               f"{os.strerror(ERRNOS[fault])}; {kept}")
    for file, data in kept_files.items():  # steps 0 and 1 as they were
        assert (folder / file).read_bytes()[:len(data)] == data, file
    assert not [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]
    rc, err = run_case("disk faults", rollout(servers, tmp_path, 3, "--resume"), tmp_path)
    assert rc == 0, err
    aside = folder / "uncommitted" / "step-00002"
    assert (sorted(p.name for p in aside.iterdir()) if aside.exists() else []) == SET_ASIDE[write]
    assert ("step 2 was not committed by the run that wrote it" in err) == bool(SET_ASIDE[write])
    steps = [json.loads(x) for x in (folder / "steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [0, 1, 2]
    delivered = [pid for s in steps for pid in s["prompt_ids"]]
    batches = [json.loads(x)["prompt_id"] for i in range(3)
               for x in (folder / f"batch-{i:05d}.jsonl").read_text().splitlines()]
    assert len(delivered) == len(set(delivered)) == 6  # every prompt delivered exactly once
    assert sorted(set(batches)) == sorted(delivered)
