"""`tailsieve trace` (issue 50, item 3; `workloads/from_logs.py`, `cli/trace_cmd.py`): verl rollout dumps, TRL
completion logs and a plain JSONL of responses become the length trace `simulate`/`plan` read; lengths come from
token counts, token ids or the model's tokenizer, never from characters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tailsieve.cli import main
from tailsieve.errors import ConfigError
from tailsieve.workloads.from_logs import Source, TraceRow, rows, write_csv


def _jsonl(path: Path, recs: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def _verl_dump(folder: Path) -> Path:
    """verl's `_dump_generations`: {step}.jsonl with input, output, gts, score, step (G = 2 per prompt)."""
    folder.mkdir()
    for step in (1, 2):
        _jsonl(folder / f"{step}.jsonl", [
            {"input": f"q{p} of step {step}", "output": " ".join(["w"] * (3 + p + step * 10 + g)), "gts": None,
             "score": 0.0, "step": step} for p in range(2) for g in range(2)])
    return folder


def words(text: str) -> int:
    return len(text.split())


def test_a_verl_dump_counts_tokens_with_the_tokenizer_and_groups_by_prompt(tmp_path: Path) -> None:
    source, trace = rows([_verl_dump(tmp_path / "dump")], words)
    assert source is Source.VERL and len(trace) == 8
    assert [r.length for r in trace[:4]] == [13, 14, 14, 15] and [r.step for r in trace] == [1] * 4 + [2] * 4
    ids = [r.prompt_id for r in trace]
    assert ids[0] == ids[1] != ids[2] == ids[3] and len(set(ids)) == 4  # a prompt's G responses share one id


def test_text_without_a_tokenizer_is_one_line_naming_the_flag(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"1\.jsonl:1: the response is text \(output\): give --tokenizer DIR"):
        rows([_verl_dump(tmp_path / "dump")])


def test_trl_completions_parquet_with_chat_messages(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    run = tmp_path / "out"
    (run / "completions").mkdir(parents=True)
    for step in (3, 6):
        table = pa.Table.from_pylist([
            {"step": step, "prompt": "p", "completion": [{"role": "assistant", "content": "a b c"}], "reward": 1.0},
            {"step": step, "prompt": "p", "completion": [{"role": "assistant", "content": "a b"}], "reward": 0.0}])
        pq.write_table(table, run / "completions" / f"completions_{step:05d}.parquet")
    source, trace = rows([run], words)  # the TRL output folder: its completions/ is read
    assert source is Source.TRL
    assert [(r.step, r.length) for r in trace] == [(3, 3), (3, 2), (6, 3), (6, 2)]


def test_a_plain_jsonl_of_lengths_ids_or_text(tmp_path: Path) -> None:
    f = _jsonl(tmp_path / "r.jsonl", [{"prompt_id": "a", "length": 7}, {"prompt_id": "a", "response_ids": [1, 2]},
                                      {"prompt": "b", "response": "x y z", "step": 4}])
    source, trace = rows([f], words)
    assert source is Source.JSONL
    assert [(r.length, r.step) for r in trace] == [(7, 0), (2, 0), (3, 4)] and trace[0].prompt_id == "a"


@pytest.mark.parametrize(("lines", "error"), [
    ("{bad\n", r"r\.jsonl:1: not JSON"),
    ('[1]\n', r"r\.jsonl:1: a record must be a JSON object, got list"),
    ('{"length": 3}\n', r"r\.jsonl:1: no prompt"),
    ('{"prompt_id": "a"}\n', r"r\.jsonl:1: no response length, token ids or text"),
    ('{"prompt_id": "a", "length": -1}\n', r"r\.jsonl:1: length must be a token count >= 0, got -1"),
    ('{"prompt_id": "a", "length": 2, "step": "x"}\n', r"r\.jsonl:1: step must be an integer, got 'x'"),
    ('{"prompt_id": "a", "length": 2}\n{"input": "q", "output": "o", "step": 1}\n',
     r"r\.jsonl:2: a verl record among jsonl records"),
    ("\n", r"no records in"),
])
def test_bad_logs_are_one_line(tmp_path: Path, lines: str, error: str) -> None:
    (tmp_path / "r.jsonl").write_text(lines)
    with pytest.raises(ConfigError, match=error):
        rows([tmp_path / "r.jsonl"], words)


def test_the_csv_quotes_ids_and_round_trips() -> None:
    assert write_csv([TraceRow("a,b", 1, 5), TraceRow("c", 2, 0)]) == 'prompt_id,step,length\n"a,b",1,5\nc,2,0\n'


def test_the_command_writes_a_trace_simulate_and_plan_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recs = [{"prompt_id": f"p{p}", "step": s, "length": 100 + 37 * ((p * 7 + g * 3 + s) % 11) + (4000 if g == p % 4
                                                                                               else 0)}
            for s in range(3) for p in range(16) for g in range(4)]
    f = _jsonl(tmp_path / "run.jsonl", recs)
    out = tmp_path / "trace.csv"
    assert main(["trace", str(f), "--out", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["source"], doc["responses"], doc["prompts"], doc["steps"]) == ("jsonl", 192, 16, 3)
    assert doc["next"].startswith(f"tailsieve plan --workload {out} ")
    assert main(["simulate", "--workload", str(out), "--groups", "4", "--group-size", "4", "--replicas", "4",
                 "--steps", "4", "--policy", "tailsieve,verl-lif", "--replications", "1", "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["workload"] and "tailsieve" in sim["vs_balancer"]
    assert main(["trace", str(f), "--out", str(out)]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert said.startswith(f"192 responses of 16 prompts over 3 steps (jsonl logs) written to {out}")


def test_command_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "t.csv")]) == 1
    missing = tmp_path / "none.jsonl"
    assert capsys.readouterr().err.strip() == f"tailsieve trace: error: {missing}: no such file or folder"
    assert main(["trace", str(tmp_path), "--out", str(tmp_path / "no" / "t.csv")]) == 1
    assert "folder" in capsys.readouterr().err
    assert main(["trace", str(tmp_path), "--out", str(tmp_path / "t.csv"), "--tokenizer", str(tmp_path)]) == 1
    assert capsys.readouterr().err.strip() == f"tailsieve trace: error: --tokenizer {tmp_path}: no tokenizer.json there"


@pytest.mark.extra("transformers")
def test_a_real_tokenizer_file_counts_the_tokens(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "w": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    (tmp_path / "tok").mkdir()
    tok.save(str(tmp_path / "tok" / "tokenizer.json"))
    out = tmp_path / "trace.csv"
    assert main(["trace", str(_verl_dump(tmp_path / "dump")), "--out", str(out), "--tokenizer",
                 str(tmp_path / "tok"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["length_max"] == 25  # step 2, prompt 1, its 2nd response
    assert out.read_text().splitlines()[1].endswith(",1,13")
