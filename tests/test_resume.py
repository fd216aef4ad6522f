"""`rollout --resume` validates the whole output folder before it runs or writes anything (engines/rollout/resume.py).

A real two-step run (static policy, a waiting candidate) against fake servers is the base folder. Generated cases
damage one thing in it, class by class (the state's step, the step file, the waiting groups, the counters, the
step lines, the batch files), and resume through the CLI in-process against healthy servers: each must exit
non-zero with one `tailsieve rollout: error:` line, no traceback, no request sent, and every file of the folder
byte-identical. The accepted cases (a step left uncommitted by a killed run) resume, moving those files into
`uncommitted/` instead of erasing them. The state's JSON round-trips field by field, and every field refuses values
of the wrong type or range in one line; a state with fields of an older controller resumes, dropping them.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from engine_fake import FakeServer
from tailsieve.cli import main
from tailsieve.engines.rollout.state import RolloutState
from tailsieve.errors import ConfigError

Doc = dict[str, Any]
POLICY = "static"


@pytest.fixture(scope="module")
def servers() -> Iterator[list[FakeServer]]:
    with FakeServer() as a, FakeServer() as b:
        yield [a, b]


def argv(servers: list[FakeServer], root: Path, steps: int, *extra: str) -> list[str]:
    return ["rollout", "--endpoints", ",".join(s.url for s in servers), "--prompts", str(root / "p.jsonl"),
            "--groups", "2", "--group-size", "2", "--rho", "0.5", "--max-tokens", "20", "--policy", POLICY, "--q", "1",
            "--m", "1", "--steps", str(steps), "--out", str(root / "out"), "--give-up-after", "0", *extra]


def cli(args: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(args)
    return rc, err.getvalue()


@pytest.fixture(scope="module")
def base(servers: list[FakeServer], tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("resume-base")
    (root / "p.jsonl").write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"what is {i}?"}) + "\n"
                                          for i in range(30)))
    assert cli(argv(servers, root, 2))[0] == 0
    state = json.loads((root / "out" / POLICY / "state.json").read_text())
    assert state["router"]["step"] == 2 and state["router"]["candidates"]  # a waiting group to damage
    return root


@pytest.fixture
def run_dir(base: Path, tmp_path: Path) -> Path:
    shutil.copytree(base, tmp_path / "r")
    return tmp_path / "r"


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------------------------ damage helpers


def state_edit(fn: Callable[[Doc], None]) -> Callable[[Path], None]:
    def apply(folder: Path) -> None:
        doc = json.loads((folder / "state.json").read_text())
        fn(doc)
        (folder / "state.json").write_text(json.dumps(doc))
    return apply


def lines_edit(fn: Callable[[list[Doc]], list[Doc] | None]) -> Callable[[Path], None]:
    def apply(folder: Path) -> None:
        path = folder / "steps.jsonl"
        rows = fn([json.loads(x) for x in path.read_text().splitlines()])
        if rows is None:
            path.unlink()
        else:
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return apply


def at(path: str, value: Any) -> Callable[[Path], None]:
    """Set state[path] (dotted keys, [i] list items) to value."""
    def fn(doc: Doc) -> None:
        keys: list[Any] = [int(k) if k.isdigit() else k for k in path.replace("[", ".").replace("]", "").split(".")]
        cur: Any = doc
        for k in keys[:-1]:
            cur = cur[k]
        cur[keys[-1]] = value
    return state_edit(fn)


def step_as(rows: list[Doc], k: int) -> Doc:
    return rows[-1] | {"step": k}


REFUSED: dict[str, dict[str, Callable[[Path], None]]] = {
    "state step": {
        "-3": at("router.step", -3), "1": at("router.step", 1), "3": at("router.step", 3),
        "7": at("router.step", 7), "text": at("router.step", "2"), "float": at("router.step", 2.0),
        "bool": at("router.step", True), "null": at("router.step", None), "2**64": at("router.step", 2**64),
    },
    "steps file": {
        "duplicated step": lines_edit(lambda r: [r[0], r[0], r[1]]),
        "missing step": lines_edit(lambda r: [r[1]]),
        "no file": lines_edit(lambda r: None),
        "reordered": lines_edit(lambda r: [r[1], r[0]]),
        "two steps ahead": lines_edit(lambda r: [*r, step_as(r, 2), step_as(r, 3)]),
        "empty": lines_edit(lambda r: []),
        "negative step": lines_edit(lambda r: [r[0], step_as(r, -1)]),
        "gap": lines_edit(lambda r: [r[0], step_as(r, 2)]),
    },
    "waiting groups": {
        "unknown prompt": at("router.candidates[0][1]", "nope"),
        "wrong prompt for its uid": at("router.candidates[0][1]", "q7"),
        "duplicated candidate": state_edit(lambda d: d["router"]["candidates"].append(d["router"]["candidates"][0])),
        "also requeued": state_edit(lambda d: d["router"].update(requeue=list(d["router"]["candidates"]))),
        "never drawn": at("router.candidates[0][0]", 999),
        "a consumed uid": at("router.candidates[0][0]", 0),
        "negative uid": at("router.candidates[0][0]", -1),
        "cut too often": at("router.candidates[0][2]", 5),
        "negative cuts": at("router.candidates[0][2]", -1),
        "not a triple": at("router.candidates[0]", [4, "q4"]),
        "empty prompt id": at("router.candidates[0][1]", ""),
        "not a list": at("router.candidates", {"4": "q4"}),
        "unknown requeued prompt": state_edit(lambda d: d["router"].update(requeue=[[4, "nope", 1]], candidates=[])),
        "requeued, wrong prompt": state_edit(lambda d: d["router"].update(requeue=[[4, "q3", 0]], candidates=[])),
    },
    "counters": {
        "consumed -1": at("router.consumed", -1), "consumed +1": at("router.consumed", 5),
        "consumed 1.5": at("router.consumed", 1.5),
        "generation -1": at("generation.q0", -1), "generation text": at("generation.q0", "1"),
        "generation of an unknown prompt": at("generation.nope", 1),
        "generation not an object": at("generation", [1, 2]),
        "weight version -1": at("weight_version", -1),
        "stream position -1": at("router.stream.position", -1), "stream position +1": at("router.stream.position", 6),
        "stream of 0 prompts": at("router.stream.n_prompts", 0),
        "stream of other prompts": at("router.stream.n_prompts", 31),
        "stream shuffled": at("router.stream.shuffle", True), "stream seed": at("router.stream.seed", 5),
        "stream shuffle 1": at("router.stream.shuffle", 1),
        "q -1": at("control.q", -1), "m -1": at("control.m", -1), "m = R": at("control.m", 2),
        "control format 1": at("control.format", 1), "decision reason": at("control.decision.reason", "bogus"),
        "uniform_dispatch": at("control.uniform_dispatch", "x"), "calib 0": at("control.calib_tail", 0),
        "calib inf": at("control.calib_bulk", 1e999), "control state bogus": at("control.state", "x"),
        "paper field, static state": at("control.hold", 0), "decision gain inf": at("control.decision.gain_s", 1e999),
        "decision not an object": at("control.decision", "fixed"),
        "history ragged": at("control.history", [[[1, 2], [3]]]),
        "history 3 wide": at("control.history", [[[1, 2, 3]]]),
        "history negative": at("control.history", [[[1, -2]]]),
        "unknown control key": at("control.bogus", 1), "unknown router key": at("router.bogus", 1),
        "unknown state key": at("bogus", 1), "missing control q": state_edit(lambda d: d["control"].pop("q")),
        "version 2": at("version", 2), "other policy": at("policy", "uniform"),
        "other shape": at("fingerprint.groups", 3),
    },
    "step lines": {
        "uid consumed twice": lines_edit(lambda r: [r[0], r[1] | {"uids": [r[0]["uids"][0], *r[1]["uids"][1:]]}]),
        "uid still waiting": lines_edit(lambda r: [r[0], r[1] | {"uids": [4, *r[1]["uids"][1:]]}]),
        "uid never drawn": lines_edit(lambda r: [r[0], r[1] | {"uids": [99, *r[1]["uids"][1:]]}]),
        "prompt not drawn at its uid": lines_edit(lambda r: [r[0], r[1] | {"prompt_ids": ["q9", "q9"]}]),
        "one group short": lines_edit(lambda r: [r[0], r[1] | {"uids": r[1]["uids"][:1], "lengths": r[1]["lengths"][:1],
                                                               "prompt_ids": r[1]["prompt_ids"][:1]}]),
        "no lengths": lines_edit(lambda r: [r[0], {k: v for k, v in r[1].items() if k != "lengths"}]),
        "decision reason": lines_edit(lambda r: [r[0], r[1] | {"decision": r[1]["decision"] | {"reason": "bogus"}}]),
        "decision option": lines_edit(lambda r: [r[0], r[1] | {"decision": r[1]["decision"] | {"option": [1]}}]),
        "decision not an object": lines_edit(lambda r: [r[0], r[1] | {"decision": [1, 1]}]),
        "not an object": lambda f: (f / "steps.jsonl").write_text((f / "steps.jsonl").read_text() + "[1]\n"),
    },
    "batch files": {
        "batch 0 missing": lambda f: (f / "batch-00000.jsonl").unlink(),
        "batch 3 ahead": lambda f: shutil.copy(f / "batch-00001.jsonl", f / "batch-00003.jsonl"),
        "batch 100000 ahead": lambda f: shutil.copy(f / "batch-00001.jsonl", f / "batch-100000.jsonl"),
        "state.json gone, steps kept": lambda f: (f / "state.json").unlink(),
    },
}
CASES = [(cls, name) for cls, variants in REFUSED.items() for name in variants]


@pytest.mark.parametrize(("cls", "variant"), CASES, ids=[f"{c}: {v}" for c, v in CASES])
def test_a_damaged_folder_is_refused_in_one_line_and_left_untouched(servers: list[FakeServer], run_dir: Path,
                                                                    cls: str, variant: str) -> None:
    REFUSED[cls][variant](run_dir / "out" / POLICY)
    before, sent = snapshot(run_dir), [s.started for s in servers]
    rc, err = cli(argv(servers, run_dir, 4, "--resume"))
    lines = err.splitlines()
    assert rc != 0 and len(lines) == 1 and lines[0].startswith("tailsieve rollout: error: "), err
    assert "internal error" not in err and "Traceback" not in err
    assert snapshot(run_dir) == before  # nothing rewritten, erased or added
    assert [s.started for s in servers] == sent  # refused before any request


def test_the_issue_cases_name_what_disagrees(servers: list[FakeServer], run_dir: Path) -> None:
    folder = run_dir / "out" / POLICY
    at("router.step", -3)(folder)
    assert "router.step must be an integer in 0..9007199254740992, got -3" in cli(
        argv(servers, run_dir, 4, "--resume"))[1]
    at("router.step", 2)(folder)
    lines_edit(lambda r: [r[0], r[1], r[1]])(folder)
    err = cli(argv(servers, run_dir, 4, "--resume"))[1]
    assert "steps.jsonl, line 3: step 1 where step 2 belongs" in err
    lines_edit(lambda r: None)(folder)
    assert f"{folder / 'state.json'} is at step 2 but there is no {folder / 'steps.jsonl'}" in cli(
        argv(servers, run_dir, 4, "--resume"))[1]


# -------------------------------------------------------------------------------------------- accepted: no loss


def test_a_step_left_uncommitted_is_moved_aside_and_rerun(servers: list[FakeServer], run_dir: Path) -> None:
    """A run killed after writing step 2's batch file and step line, before its state: the resumed run reruns step
    2 and keeps the orphaned files under uncommitted/step-00002/, byte for byte."""
    folder = run_dir / "out" / POLICY
    lines = (folder / "steps.jsonl").read_text().splitlines()
    orphan = json.dumps(json.loads(lines[-1]) | {"step": 2, "note": "orphan"})
    (folder / "steps.jsonl").write_text("\n".join([*lines, orphan]) + "\n")
    shutil.copy(folder / "batch-00001.jsonl", folder / "batch-00002.jsonl")
    before = snapshot(run_dir)
    rc, err = cli(argv(servers, run_dir, 3, "--resume"))
    assert rc == 0, err
    after = snapshot(run_dir)
    aside = f"out/{POLICY}/uncommitted/step-00002"
    assert after[f"{aside}/steps.jsonl"] == (orphan + "\n").encode()
    assert after[f"{aside}/batch-00002.jsonl"] == before[f"out/{POLICY}/batch-00002.jsonl"]
    new = after[f"out/{POLICY}/steps.jsonl"].decode().splitlines()
    assert new[:2] == lines and [json.loads(x)["step"] for x in new] == [0, 1, 2] and "orphan" not in new[2]
    for name in ("batch-00000.jsonl", "batch-00001.jsonl", "../p.jsonl"):
        key = str(Path(f"out/{POLICY}/{name}")).replace(f"out/{POLICY}/../", "")
        assert after[key] == before[key]


def test_a_batch_file_left_uncommitted_is_moved_aside(servers: list[FakeServer], run_dir: Path) -> None:
    folder = run_dir / "out" / POLICY
    shutil.copy(folder / "batch-00000.jsonl", folder / "batch-00002.jsonl")
    kept = (folder / "batch-00002.jsonl").read_bytes()
    assert cli(argv(servers, run_dir, 3, "--resume"))[0] == 0
    assert (folder / "uncommitted" / "step-00002" / "batch-00002.jsonl").read_bytes() == kept
    assert not (folder / "uncommitted" / "step-00002" / "steps.jsonl").exists()
    assert (folder / "batch-00002.jsonl").read_bytes() != kept


def test_a_first_step_without_its_state_is_moved_aside(servers: list[FakeServer], run_dir: Path) -> None:
    """Killed before the first state.json: the step-0 files are kept aside and the run starts again at step 0."""
    folder = run_dir / "out" / POLICY
    (folder / "state.json").unlink()
    (folder / "batch-00001.jsonl").unlink()
    lines_edit(lambda r: r[:1])(folder)
    line0 = (folder / "steps.jsonl").read_bytes()
    assert cli(argv(servers, run_dir, 1, "--resume"))[0] == 0
    assert (folder / "uncommitted" / "step-00000" / "steps.jsonl").read_bytes() == line0
    assert [json.loads(x)["step"] for x in (folder / "steps.jsonl").read_text().splitlines()] == [0]


def test_a_clean_resume_consumes_every_draw_once(servers: list[FakeServer], run_dir: Path) -> None:
    assert cli(argv(servers, run_dir, 4, "--resume"))[0] == 0
    folder = run_dir / "out" / POLICY
    uids = [json.loads(x)["uid"] for k in range(4) for x in (folder / f"batch-{k:05d}.jsonl").read_text().splitlines()]
    state = RolloutState.load(folder / "state.json")
    waiting = [r.uid for r in state.router.waiting]
    assert state.router.stream is not None and not (folder / "uncommitted").exists()
    assert len(uids) == len(set(uids)) == 8 == state.router.consumed
    assert sorted(uids + waiting) == list(range(state.router.stream.position))


def test_a_state_saved_by_an_older_version_is_refused_in_one_line(servers: list[FakeServer], run_dir: Path) -> None:
    """A state.json whose control state has no format (written before the format was saved, with the fields of that
    controller, `last_fresh` or `bias_step` among them) is refused in one line naming the format, never read in part,
    and the folder is left as it was."""
    folder = run_dir / "out" / POLICY
    state_edit(lambda d: d["control"].pop("format"))(folder)
    state_edit(lambda d: d["control"].update(last_fresh=[[[4, 0, 1, 3, 20], [5, 1, 2, 6, 7]]], bias_step=0.07))(
        folder)
    before = snapshot(run_dir)
    rc, err = cli(argv(servers, run_dir, 4, "--resume"))
    assert rc != 0 and len(err.splitlines()) == 1, err
    assert err.endswith("control: saved by an older TailSieve (no format); this version restores format 2 only: "
                        "start a fresh run, or resume with the version that saved it\n"), err
    assert snapshot(run_dir) == before


# --------------------------------------------------------------------------------- the state, field by field


def leaves(doc: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every scalar's path in a JSON document (a list of lists, e.g. a history table, counts as one value)."""
    if isinstance(doc, dict) and doc:
        for k, v in doc.items():
            yield from leaves(v, (*path, k))
    elif isinstance(doc, list) and doc and not isinstance(doc[0], list):
        for i, v in enumerate(doc):
            yield from leaves(v, (*path, i))
    else:
        yield path


HOSTILE_VALUES = (-1, 0, 1, 2.5, 2**64, -(2**70), True, None, "x", "", [], {}, [[1, 2]], float("nan"))


def test_every_state_field_round_trips_or_is_refused_in_one_line(base: Path) -> None:
    """The saved state rebuilt from its JSON equals it field by field; each field set to each hostile value is
    either refused with one ConfigError line naming it, or rebuilt to exactly the document that was read."""
    doc = json.loads((base / "out" / POLICY / "state.json").read_text())
    doc["control"]["history"] = [[[3, 4], [5, 6]]]
    assert RolloutState.from_json(doc).to_json() == doc
    paths = list(leaves(doc))
    refused = accepted = 0
    for path in paths:
        for value in HOSTILE_VALUES:
            bad = json.loads(json.dumps(doc))
            cur = bad
            for k in path[:-1]:
                cur = cur[k]
            cur[path[-1]] = value
            try:
                back = RolloutState.from_json(bad).to_json()
            except ConfigError as exc:
                assert len(str(exc).splitlines()) == 1 and str(exc), (path, value)
                refused += 1
                continue
            accepted += 1
            assert json.loads(json.dumps(back).replace("NaN", "null")) == json.loads(
                json.dumps(bad).replace("NaN", "null")), (path, value)
    assert refused > len(paths) * len(HOSTILE_VALUES) // 2 and accepted > 0
