"""The skip rule for optional extras (tests/conftest.py): the reason names the install command, and under
TAILSIEVE_REQUIRE_EXTRAS=1 (set by .ci/run) a missing extra, or any import skip, is a failure."""

from __future__ import annotations

from pathlib import Path

import pytest

import conftest

pytest_plugins = ["pytester"]
FAKE = ("tailsieve_no_such_module", "pip install fake-extra")


def test_missing_extra_reason_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(conftest.EXTRAS, "fake", FAKE)
    assert conftest.missing_extra("fake") == "needs the fake extra: pip install fake-extra"
    monkeypatch.setitem(conftest.EXTRAS, "fake", ("json", "pip install json"))
    assert conftest.missing_extra("fake") is None


def test_require_extra_skips_or_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(conftest.EXTRAS, "fake", FAKE)
    monkeypatch.setattr(conftest, "REQUIRE_EXTRAS", False)  # as on a user's clone, whatever this run sets
    with pytest.raises(pytest.skip.Exception, match="^needs the fake extra: pip install fake-extra$"):
        conftest.require_extra("fake")
    monkeypatch.setattr(conftest, "REQUIRE_EXTRAS", True)
    with pytest.raises(pytest.fail.Exception, match="^TAILSIEVE_REQUIRE_EXTRAS=1 but needs the fake extra"):
        conftest.require_extra("fake")


INNER = '''
import pytest

@pytest.mark.extra("fake")
def test_marked():
    pass

def test_importorskip():
    pytest.importorskip("tailsieve_no_such_module")

def test_plain_skip():
    pytest.skip("not an extra")
'''


@pytest.mark.parametrize(("require", "outcomes"),
                         [("0", {"skipped": 3}), ("1", {"errors": 1, "failed": 1, "skipped": 1})])
def test_marker_and_importorskip_in_a_real_session(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, require: str, outcomes: dict[str, int]
) -> None:
    """A plain skip stays a skip either way; the extra marker (at setup) and importorskip fail only under the
    variable, and the session then exits non-zero."""
    text = Path(conftest.__file__).read_text(encoding="utf-8")
    pytester.makeconftest(text.replace('"pyarrow": (', f'"fake": {FAKE!r},\n    "pyarrow": ('))
    pytester.makepyfile(INNER)
    monkeypatch.setenv("TAILSIEVE_REQUIRE_EXTRAS", require)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-o", "markers=extra: optional extras")
    result.assert_outcomes(**outcomes)
    assert (result.ret == 0) is (require == "0")
