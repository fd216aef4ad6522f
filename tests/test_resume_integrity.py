"""A resume verifies what it builds on (issue 49 item 2): each step line seals its batch file (byte length, BLAKE2b
digest, the uids it consumed), and `rollout --resume` checks every committed batch before a step runs.

A real two-step run against fake servers is the base folder. Generated cases damage the committed batch files the
ways the fourth hostile corpus did (truncated, emptied, NUL-filled, swapped, replaced by another step's, grown, one
byte flipped, a link) in a sealed folder and in an older, unsealed one; each resume must exit non-zero with one line
naming the file and the step, send no request, and leave every file byte-identical. A symlinked `uncommitted/` is
refused before anything moves. A clean resume of either kind goes ahead and its new step lines carry the seal."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from engine_fake import FakeServer
from test_resume import POLICY, argv, cli  # the same rollout command line


@pytest.fixture(scope="module")
def servers() -> Iterator[list[FakeServer]]:
    with FakeServer() as a, FakeServer() as b:
        yield [a, b]


@pytest.fixture(scope="module")
def base(servers: list[FakeServer], tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("resume-integrity")
    (root / "p.jsonl").write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"what is {i}?"}) + "\n"
                                          for i in range(30)))
    assert cli(argv(servers, root, 3))[0] == 0
    return root


@pytest.fixture(params=["sealed", "unsealed"])
def run_dir(request: pytest.FixtureRequest, base: Path, tmp_path: Path) -> Path:
    """A copy of the base folder; `unsealed`: its step lines without the seal (a folder an older version wrote)."""
    shutil.copytree(base, tmp_path / "r")
    if request.param == "unsealed":
        steps = tmp_path / "r" / "out" / POLICY / "steps.jsonl"
        rows = [json.loads(x) for x in steps.read_text().splitlines()]
        steps.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "batch"}) + "\n" for r in rows))
    return tmp_path / "r"


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _swap(a: Path, b: Path) -> None:
    tmp = a.with_suffix(".tmp")
    os.replace(a, tmp)
    os.replace(b, a)
    os.replace(tmp, b)


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    i = data.index(b'"text"') + 10
    data[i] ^= 0x01
    path.write_bytes(bytes(data))


def _link(path: Path) -> None:
    keep = path.with_name("elsewhere.jsonl")
    os.replace(path, keep)
    path.symlink_to(keep.name)


B0, B1 = "batch-00000.jsonl", "batch-00001.jsonl"
# damage → (the file and step the refusal must name)
DAMAGE: dict[str, tuple[Callable[[Path], None], str, int]] = {
    "truncated": (lambda f: (f / B1).write_bytes((f / B1).read_bytes()[:37]), B1, 1),
    "emptied": (lambda f: (f / B0).write_bytes(b""), B0, 0),
    "NUL-filled, same length": (lambda f: (f / B1).write_bytes(b"\0" * (f / B1).stat().st_size), B1, 1),
    "swapped with the next step's": (lambda f: _swap(f / B0, f / B1), B0, 0),
    "replaced by another step's copy": (lambda f: shutil.copy(f / B0, f / B1), B1, 1),
    "a line appended": (lambda f: (f / B0).write_bytes((f / B0).read_bytes() + (f / B0).read_bytes()
                                                        .splitlines(keepends=True)[0]), B0, 0),
    "its last line dropped": (lambda f: (f / B1).write_bytes(b"".join((f / B1).read_bytes()
                                                                       .splitlines(keepends=True)[:-1])), B1, 1),
    "a symbolic link to a copy": (lambda f: _link(f / B0), B0, 0),
}


class TestResumeVerifiesBatches:
    """Each damage × sealed/unsealed folder: refused in one line naming the file and the step, nothing touched."""

    @pytest.mark.parametrize("damage", list(DAMAGE))
    def test_a_damaged_batch_is_refused_before_any_step(self, servers: list[FakeServer], run_dir: Path,
                                                        damage: str) -> None:
        fn, name, step = DAMAGE[damage]
        folder = run_dir / "out" / POLICY
        fn(folder)
        before, sent = snapshot(run_dir), [s.started for s in servers]
        rc, err = cli(argv(servers, run_dir, 5, "--resume"))
        lines = err.splitlines()
        assert rc != 0 and len(lines) == 1 and lines[0].startswith("tailsieve rollout: error: "), err
        assert str(folder / name) in lines[0] and f"step {step}" in lines[0], lines[0]
        assert "internal error" not in err
        assert snapshot(run_dir) == before  # nothing rewritten, erased, moved or added
        assert [s.started for s in servers] == sent  # refused before any request

    def test_a_one_byte_edit_is_caught_by_the_digest(self, servers: list[FakeServer], base: Path,
                                                     tmp_path: Path) -> None:
        shutil.copytree(base, tmp_path / "r")
        folder = tmp_path / "r" / "out" / POLICY
        _flip(folder / B1)
        rc, err = cli(argv(servers, tmp_path / "r", 5, "--resume"))
        assert rc != 0 and "BLAKE2b" in err and f"{folder / B1} (step 1)" in err, err

    def test_a_linked_uncommitted_folder_is_refused_and_nothing_moves(self, servers: list[FakeServer],
                                                                      run_dir: Path, tmp_path: Path) -> None:
        folder = run_dir / "out" / POLICY
        outside = tmp_path / "outside"
        outside.mkdir()
        (folder / "uncommitted").symlink_to(outside)
        shutil.copy(folder / B0, folder / "batch-00003.jsonl")  # a killed run's uncommitted step 3
        before = snapshot(run_dir)
        rc, err = cli(argv(servers, run_dir, 5, "--resume"))
        assert rc != 0 and "uncommitted" in err and len(err.splitlines()) <= 2, err
        assert list(outside.iterdir()) == [] and snapshot(run_dir) == before

    def test_a_clean_folder_resumes_and_seals_its_new_steps(self, servers: list[FakeServer], run_dir: Path) -> None:
        rc, err = cli(argv(servers, run_dir, 5, "--resume"))
        assert rc == 0, err
        rows = [json.loads(x) for x in (run_dir / "out" / POLICY / "steps.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
        for r in rows[3:]:
            data = (run_dir / "out" / POLICY / f"batch-{r['step']:05d}.jsonl").read_bytes()
            assert r["batch"]["bytes"] == len(data) and len(r["batch"]["blake2b"]) == 32
            assert [json.loads(x)["uid"] for x in data.splitlines()] == r["uids"]
