"""`tailsieve rollout` and `tailsieve profile` against fake servers: files, report keys, errors, resume, plot series."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import DATA
from engine_fake import FakeServer
from tailsieve.cli import main
from tailsieve.cli.profile_view import context_label, context_series
from tailsieve.engines.measure.profile import ProfilePoint
from tailsieve.engines.rollout.prompts import Template, load_prompts, prompt_path, render
from tailsieve.errors import ConfigError
from tailsieve.model.costmodel import load_cost_model
from tailsieve.model.curve_names import load_curve

PROMPT_EXCERPTS = DATA / "prompts"  # first 5 records of each shared prompt set (tests/data/README.md)
STEP_KEYS = {"step", "makespan_s", "tail_s", "bulk_s", "q", "m", "candidates", "wasted_tokens", "batch_mean_length"}


@pytest.fixture
def two() -> Iterator[list[FakeServer]]:
    with FakeServer() as a, FakeServer() as b:
        yield [a, b]


@pytest.fixture
def prompts(tmp_path: Path) -> Path:
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"question_id": f"q{i}", "question": f"what is {i}+{i}?"}) + "\n"
                            for i in range(30)))
    return path


def rollout(urls: list[str], prompts: Path, out: Path, *extra: str) -> int:
    return main(["rollout", "--endpoints", ",".join(urls), "--prompts", str(prompts), "--groups", "4",
                 "--group-size", "3", "--rho", "0.5", "--max-tokens", "30", "--stall-timeout", "2", *extra,
                 "--out", str(out)])


def test_rollout_writes_batches_and_simulate_shaped_report(two: list[FakeServer], prompts: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert rollout([s.url for s in two], prompts, out, "--steps", "3", "--policy", "static,uniform") == 0
    rep = json.loads((out / "report.json").read_text())
    assert set(rep["policies"]) == {"static", "uniform"}
    for pol in rep["policies"].values():
        assert {"mean_step_s", "speedup", "steps"} <= set(pol)
        assert len(pol["steps"]) == 3 and all(set(s) >= STEP_KEYS for s in pol["steps"])
    assert rep["policies"]["uniform"]["speedup"] == 1.0
    rows = [json.loads(x) for x in (out / "static" / "batch-00001.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and rows[0]["pool"] == "tail"
    assert {"prompt_id", "samples", "tokens", "finish_reasons"} <= set(rows[0])
    assert len(rows[0]["samples"]) == 3 and rows[0]["prompt_id"].startswith("q")
    printed = capsys.readouterr().out
    assert "step s" in printed and "static" in printed


def test_rollout_error_keeps_partial_results_and_resume_continues(two: list[FakeServer], prompts: Path,
                                                                   tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    for s in two:
        s.fail_after, s.then = 14, "500"  # step 0 (6 groups × 3 = 18 requests over 2 replicas) passes
    rc = rollout([s.url for s in two], prompts, out, "--steps", "4", "--policy", "uniform", "--retries", "1",
                 "--give-up-after", "0.5")
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and err[-1].startswith("tailsieve rollout: error:")
    assert (out / "uniform" / "batch-00000.jsonl").exists()
    done = json.loads((out / "report.json").read_text())["policies"]["uniform"]["steps"]
    assert len(done) >= 1
    for s in two:
        s.fail_after = None
    assert rollout([s.url for s in two], prompts, out, "--steps", "4", "--policy", "uniform", "--resume") == 0
    steps = json.loads((out / "report.json").read_text())["policies"]["uniform"]["steps"]
    assert [s["step"] for s in steps] == [0, 1, 2, 3]
    uids = [json.loads(x)["uid"] for k in range(4)
            for x in (out / "uniform" / f"batch-{k:05d}.jsonl").read_text().splitlines()]
    assert len(uids) == len(set(uids)) == 16


def test_rollout_user_errors(two: list[FakeServer], prompts: Path, tmp_path: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    assert rollout([two[0].url], prompts, tmp_path / "a", "--policy", "tailsieve") == 1
    assert "policy tailsieve needs at least 2 replicas (a tail and a bulk pool), got R=1" in capsys.readouterr().err
    assert rollout([s.url for s in two], prompts, tmp_path / "b", "--policy", "nope") == 1
    assert "unknown policy 'nope'" in capsys.readouterr().err
    for s in two:
        s.stop()
    assert rollout([s.url for s in two], prompts, tmp_path / "c", "--policy", "uniform") == 1
    assert "no endpoint answers /health" in capsys.readouterr().err
    out = tmp_path / "d"
    (out / "uniform").mkdir(parents=True)
    (out / "uniform" / "steps.jsonl").write_text("")
    assert rollout([s.url for s in two], prompts, out, "--policy", "uniform") == 1
    assert "--resume" in capsys.readouterr().err


def test_profile_writes_a_loadable_curve_and_plot(two: list[FakeServer], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    two[0].tpot_s, two[0].slope = 0.002, 0.25
    out, png = tmp_path / "curve.json", tmp_path / "curve.png"
    assert main(["profile", "--endpoint", two[0].url, "--batches", "1,4,16", "--max-tokens", "20", "--contexts", "0",
                 "--out", str(out), "--plot", str(png)]) == 0
    curve = load_curve(str(out))
    assert curve.batch == (1, 4, 16) and curve.tpot_ms[2] > curve.tpot_ms[0] > 1.0
    assert png.stat().st_size > 1000
    assert all(b["ignore_eos"] and b["max_tokens"] in (16, 20) for b in two[0].bodies)
    assert "tpot ms" in capsys.readouterr().out
    assert main(["profile", "--endpoint", two[0].url, "--batches", "0,x", "--out", str(out)]) == 1
    assert main(["profile", "--endpoint", two[0].url, "--contexts", "-1", "--out", str(out)]) == 1
    assert main(["profile", "--endpoint", two[0].url, "--out", str(tmp_path / "nope" / "c.json")]) == 1


def test_bundled_math500_by_name(two: list[FakeServer], tmp_path: Path) -> None:
    """`--prompts math500`: the package's first 200 MATH-500 problems, in file order, each with its answer; a missing
    file's error names the bundled sets."""
    recs = load_prompts("math500")
    assert len(recs) == 200 and len({r.prompt_id for r in recs}) == 200
    assert recs[0].prompt_id == "test/precalculus/807.json" and recs[0].text.startswith("Convert the point $(0,3)$")
    assert all(r.field("answer") for r in recs) and prompt_path("math500").name == "math500.jsonl"
    with pytest.raises(ConfigError, match=r"^prompt file nosuch.jsonl not found \(bundled prompt sets: math500\)$"):
        load_prompts("nosuch.jsonl")
    out = tmp_path / "run"
    assert main(["rollout", "--endpoints", ",".join(s.url for s in two), "--prompts", "math500", "--template", "math",
                 "--groups", "4", "--group-size", "2", "--max-tokens", "20", "--steps", "1", "--policy", "uniform",
                 "--out", str(out)]) == 0
    rows = [json.loads(x) for x in (out / "uniform" / "batch-00000.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(r["prompt_id"].startswith("test/") for r in rows)


@pytest.mark.parametrize("name", ["aime2024.jsonl", "aime2025.jsonl", "gsm8k_test.jsonl", "kodcode_demo_232.jsonl",
                                  "livecodebench_v5_qwq.jsonl", "gsm8k_train.jsonl.gz"])
def test_shared_prompt_files_load(name: str) -> None:
    path = PROMPT_EXCERPTS / name
    recs = load_prompts(path, limit=5)
    assert len(recs) == 5 and all(r.text.strip() for r in recs)
    math_msg = render(recs[0], Template.MATH)
    assert isinstance(math_msg, tuple) and math_msg[0][1].startswith(recs[0].text.strip()[:20])
    assert "<END>" in math_msg[0][1]
    code = render(recs[0], Template.CODE)
    assert isinstance(code, tuple) and code[0] == ("system", "You are an expert Python programmer.")


def test_prompt_file_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1, "answer": 3}\n')
    assert main(["rollout", "--endpoints", "http://127.0.0.1:1", "--prompts", str(bad), "--out",
                 str(tmp_path / "o"), "--policy", "uniform"]) == 1
    dup = tmp_path / "dup.jsonl"
    dup.write_text('{"id": "a", "prompt": "x"}\n{"id": "a", "prompt": "y"}\n')
    assert [r.prompt_id for r in load_prompts(dup)] == ["a", "a#1"]
    dup.write_text('{"id": "a", "prompt": "x"}\n{"id": "a", "prompt": "y"}\n{"id": "a#1", "prompt": "z"}\n'
                   '{"id": "b", "prompt": "w"}\n')
    with pytest.raises(ConfigError, match="line 3: id 'a#1' is already the id of line 2"):
        load_prompts(dup)
    assert [r.prompt_id for r in load_prompts(dup, limit=2)] == ["a", "a#1"]  # the collision is not read


def _checkpoint(folder: Path, name: str) -> Path:
    d = folder / name
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"")
    return d


def test_rollout_weights_dir_reloads_each_new_checkpoint(two: list[FakeServer], prompts: Path,
                                                        tmp_path: Path) -> None:
    ckpts = tmp_path / "ckpts"
    ckpts.mkdir()
    (ckpts / "half-written").mkdir()  # no config.json yet: never picked
    first = _checkpoint(ckpts, "step-1")
    out = tmp_path / "run"
    assert rollout([s.url for s in two], prompts, out, "--steps", "2", "--policy", "uniform", "--weights-dir",
                   str(ckpts), "--logprobs") == 0
    assert all(s.reloads == [str(first.resolve())] for s in two)  # loaded once, not again while unchanged
    rows = [json.loads(x) for f in sorted((out / "uniform").glob("batch-*.jsonl")) for x in f.read_text().splitlines()]
    assert len(rows) == 2 * 4
    assert {smp["weight_version"] for r in rows for smp in r["samples"]} == {1}
    assert all(len(smp["logprobs"]) == smp["tokens"] for r in rows for smp in r["samples"])


def test_rollout_weights_dir_errors(two: list[FakeServer], prompts: Path, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    urls = [s.url for s in two]
    assert rollout(urls, prompts, tmp_path / "a", "--weights-dir", str(tmp_path / "none")) == 1
    assert "--weights-dir" in capsys.readouterr().err
    assert rollout(urls, prompts, tmp_path / "b", "--weights-dir", str(tmp_path), "--policy", "uniform,tailsieve") == 1
    assert "exactly one --policy" in capsys.readouterr().err


def test_profile_fits_the_cost_model_on_a_fake_server(two: list[FakeServer], tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Default `--contexts`: prompts sized on the server's counts (one token per word here), every batch size at every
    context, prefill probes, the fitted model file (a curve file too) with residuals, the fit plot."""
    two[0].tpot_s, two[0].slope = 0.002, 0.25
    out, png = tmp_path / "model.json", tmp_path / "fit.png"
    assert main(["profile", "--endpoint", two[0].url, "--batches", "1,4", "--max-tokens", "8", "--contexts",
                 "0,64,256", "--out", str(out), "--plot", str(png)]) == 0
    doc = json.loads(out.read_text())
    pt = [p["prompt_tokens"] for p in doc["points"]]
    assert pt[0] == pt[1] == 3 and 64 <= pt[2] == pt[3] <= 80 and 256 <= pt[4] == pt[5] <= 280
    assert [p["requested_context"] for p in doc["points"]] == [0, 0, 64, 64, 256, 256]
    assert len(doc["fit"]["decode"]) == 6 and len(doc["fit"]["prefill"]) == 3
    model = load_cost_model(str(out))
    assert model.curve.batch == (1, 4) and model.kv_ms_per_1k >= 0 and model.prefill_ms_per_token >= 0
    assert load_curve(str(out)).batch == (1, 4) and png.stat().st_size > 1000
    assert "fitted cost model" in capsys.readouterr().out
    seeded = [b for b in two[0].bodies if len(str(b.get("prompt")).split()) >= 16]
    assert seeded and all(b.get("seed") is None for b in seeded)  # long prompts: no seed (chunked prefill)


def test_plot_series_are_the_contexts_asked_for_not_the_measured_counts() -> None:
    """One 1024-token context the server counted as 1060 and 1070 tokens is one series, labelled 1024."""
    def point(batch: int, measured: float, asked: int) -> ProfilePoint:
        return ProfilePoint(batch, 1.0 + batch, 2.0, 3.0, 0.5, 100.0, prompt_tokens=measured, max_tokens=8,
                            requested_context=asked)

    pts = [point(1, 1060.0, 1024), point(4, 1070.0, 1024), point(1, 3.0, 0), point(4, 4.0, 0),
           point(1, 4101.0, 4096), point(4, 4139.0, 4096)]
    series = context_series(pts)
    assert list(series) == [0, 1024, 4096]  # increasing context, whatever the order measured
    assert [p.prompt_tokens for p in series[1024]] == [1060.0, 1070.0]
    assert [p.batch for p in series[0]] == [1, 4] and [p.batch for p in series[4096]] == [1, 4]
    assert [context_label(c) for c in series] == ["measured, short prompt", "measured, 1024-token prompt",
                                                  "measured, 4096-token prompt"]
