"""Integer-list flags take ranges as well as comma lists (issue 42: `--spec-budgets 0..7`, written in the issue
itself, was refused): one parser (`inputs.int_list`) behind `--spec-budgets`, `--spec-depths`, `--batches` and
`--contexts`. Generated: each flag × each form (a comma list, a range, a mix, a range of one, spaces and repeats; a
word, a backwards range, a half range, a value outside the flag's bounds, an empty list, a range past the value cap)
→ the sorted distinct values, or one error line naming the flag and the item."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from tailsieve.cli import main
from tailsieve.cli.plan_spec import parse_depths
from tailsieve.cli.simulate_spec import parse_budgets
from tailsieve.engines.measure.profile import MAX_CONTEXT, parse_batches, parse_contexts
from tailsieve.errors import TailSieveError
from tailsieve.inputs import MAX_LIST_VALUES
from tailsieve.model.curves import MAX_BATCH
from tailsieve.model.speculative import MAX_TOKENS

# flag → (its parser, its lowest and highest value)
FLAGS: dict[str, tuple[Callable[[str], tuple[int, ...]], int, int]] = {
    "--spec-budgets": (parse_budgets, 0, MAX_TOKENS // 2),
    "--spec-depths": (parse_depths, 0, MAX_TOKENS),
    "--batches": (parse_batches, 1, MAX_BATCH),
    "--contexts": (parse_contexts, 0, MAX_CONTEXT),
}
# form (from the flag's bounds lo, hi) → (text, the values it names)
VALID: dict[str, Callable[[int, int], tuple[str, list[int]]]] = {
    "comma list": lambda lo, hi: (f"{lo + 2},{lo},{lo + 1}", [lo, lo + 1, lo + 2]),
    "range": lambda lo, hi: (f"{lo}..{lo + 7}", list(range(lo, lo + 8))),
    "mix": lambda lo, hi: (f"{lo},{lo + 3}..{lo + 5},{hi}", [lo, lo + 3, lo + 4, lo + 5, hi]),
    "range of one": lambda lo, hi: (f"{hi}..{hi}", [hi]),
    "spaces, repeats, trailing comma": lambda lo, hi: (f" {lo + 1} , {lo}..{lo + 2}, {lo + 1},", [lo, lo + 1, lo + 2]),
}
# form → (text, the error's text after the flag)
INVALID: dict[str, Callable[[int, int], tuple[str, str]]] = {
    "word": lambda lo, hi: (f"{lo},x", " must be comma-separated integers or ranges A..B, got 'x'"),
    "backwards range": lambda lo, hi: (f"{lo + 3}..{lo}", f": the range '{lo + 3}..{lo}' runs backwards; write A..B "
                                                          "with A <= B"),
    "half range": lambda lo, hi: (f"{lo}..", f" must be comma-separated integers or ranges A..B, got '{lo}..'"),
    "three dots": lambda lo, hi: (f"{lo}...{lo + 2}",
                                  f" must be comma-separated integers or ranges A..B, got '{lo}...{lo + 2}'"),
    "below": lambda lo, hi: (f"{lo - 1}..{lo + 1}", f" values must lie in {lo}..{hi}, got {lo - 1}"),
    "above": lambda lo, hi: (f"{lo}..{hi + 1}", f" values must lie in {lo}..{hi}, got {hi + 1}"),
    "empty": lambda lo, hi: (" , ", " is empty; give integers such as 0,1,2 or a range such as 0..3"),
}
BIG = {"--batches": "1..1000000", "--contexts": "0..1000000"}  # ranges past MAX_LIST_VALUES values


@pytest.mark.parametrize("form", list(VALID))
@pytest.mark.parametrize("flag", list(FLAGS))
def test_a_list_flag_takes_comma_lists_and_ranges(flag: str, form: str) -> None:
    parse, lo, hi = FLAGS[flag]
    text, want = VALID[form](lo, hi)
    assert parse(text) == tuple(want)


CASES = [(flag, form) for flag in FLAGS for form in INVALID] + [(flag, "too many values") for flag in BIG]


@pytest.mark.parametrize(("flag", "form"), CASES, ids=[f"{f}-{k}" for f, k in CASES])
def test_a_bad_list_is_one_line_naming_the_flag_and_item(flag: str, form: str) -> None:
    parse, lo, hi = FLAGS[flag]
    text, tail = (BIG[flag], f" names more than {MAX_LIST_VALUES} values") if form == "too many values" else \
        INVALID[form](lo, hi)
    with pytest.raises(TailSieveError) as err:
        parse(text)
    assert str(err.value) == flag + tail


def test_simulate_spec_budgets_takes_the_range_of_issue_42(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--spec", "mtp", "--steps", "3", "--groups", "4", "--group-size", "2", "--replicas", "2",
            "--json", "--spec-budgets"]
    assert main([*argv, "0..2"]) == 0
    ranged = json.loads(capsys.readouterr().out)
    assert [b["d_base"] for b in ranged["budgets"]] == [0, 1, 2]
    assert main([*argv, "0,1,2"]) == 0
    assert json.loads(capsys.readouterr().out)["budgets"] == ranged["budgets"]
    assert main([*argv, "2..0"]) == 1
    cap = capsys.readouterr()
    assert (cap.out, cap.err) == ("", "tailsieve simulate: error: --spec-budgets: the range '2..0' runs backwards; "
                                      "write A..B with A <= B\n")
