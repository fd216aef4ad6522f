"""Prompt ids are the user's (issue 41): an empty id, or one that clashes with an id TailSieve generates (`line-N`
for a record without an id), is refused in one line naming the file and the line; nothing is renamed silently.
Generated: files of ids (None: the record has no id field) → the ids loaded, or the refusal (loaded directly, and
through `tailsieve rollout`, which must exit 1 with that one line before contacting any server)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tailsieve.cli import main
from tailsieve.engines.rollout.prompts import load_prompts
from tailsieve.errors import ConfigError

# ids per line (None: no id field) -> the ids loaded, or the refusal after "prompt file PATH, "
CASES: dict[str, tuple[list[Any], list[str] | str]] = {
    "empty": (["a", "", "b"], "line 2: id 'id' is empty"),
    "blank": (["a", "   ", "b"], "line 2: id 'id' is empty"),
    "empty first": (["", "a"], "line 1: id 'id' is empty"),
    "empty id beside another id field": ([{"id": "", "question_id": "q"}], "line 1: id 'id' is empty"),
    "missing then its generated id": ([None, "line-1"], "line 2: id 'line-1' is the id generated for line 1, which "
                                                         "has no id"),
    "generated id taken before": (["line-2", None], "line 2 has no id, and the id it would get, 'line-2', is the "
                                                    "id of line 1"),
    "generated id repeated before": (["line-3", "line-3", None], "line 3 has no id, and the id it would get, "
                                                                 "'line-3', is the id of line 1"),
    "generated id far ahead": ([None, "x", "y", "line-1"], "line 4: id 'line-1' is the id generated for line 1, "
                                                           "which has no id"),
    # controls: ids that clash with nothing are kept as given
    "no ids": ([None, None, None], ["line-1", "line-2", "line-3"]),
    "mixed": (["a", None, "line-9", 0], ["a", "line-2", "line-9", "0"]),
    "repeats": (["a", "a", None], ["a", "a#1", "line-3"]),
}


def _write(path: Path, ids: list[Any]) -> Path:
    rows = []
    for i, v in enumerate(ids):
        if isinstance(v, dict):
            rows.append({**v, "prompt": f"q{i}"})
        else:
            rows.append({"prompt": f"q{i}"} if v is None else {"id": v, "prompt": f"q{i}"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("case", sorted(CASES))
def test_prompt_ids_are_the_users(case: str, tmp_path: Path) -> None:
    ids, expect = CASES[case]
    path = _write(tmp_path / "p.jsonl", ids)
    if isinstance(expect, list):
        assert [r.prompt_id for r in load_prompts(path)] == expect
        return
    with pytest.raises(ConfigError) as e:
        load_prompts(path)
    assert str(e.value).startswith(f"prompt file {path}, {expect}"), str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("case", sorted(k for k, (_, v) in CASES.items() if isinstance(v, str)))
def test_rollout_refuses_them_in_one_line(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ids, expect = CASES[case]
    path = _write(tmp_path / "p.jsonl", ids)
    rc = main(["rollout", "--endpoints", "http://127.0.0.1:1", "--prompts", str(path), "--out",
               str(tmp_path / "o"), "--policy", "uniform"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and f"prompt file {path}, {expect}" in err[0], err
    assert "Traceback" not in err[0]
