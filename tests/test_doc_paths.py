"""No doc, benchmark or README cites a repository file that does not exist (issue 50, item 6): every path under the
repository's folders named in README.md, docs/, bench/ and examples/ exists, except output paths that are git-ignored
(`bench/results/`), globs and templates (`tests/test_engine_*.py`, `tests/test_<name>.py`) and paths in other
repositories (named after a repository, e.g. "NovaSky-AI/SkyRL `docs/...`" or "**verl** (`docs/...`)")."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PATH = re.compile(r"(?<![\w/.-])((?:src|tests|bench|docs|examples|scripts|\.ci)/[\w./-]*\w)")
IGNORED = ("bench/results",)  # git-ignored output folders (.gitignore)
# lines that cite another project's files (their docs folders, not ours)
OTHER_REPO = re.compile(r"NovaSky-AI/SkyRL|\*\*verl\*\* \(`docs/")


def cited(text: str) -> list[tuple[int, str]]:
    """(line number, path) of every repository path a text cites (globs and templates left out)."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if OTHER_REPO.search(line):
            continue
        for m in PATH.finditer(line):
            path = m.group(1).rstrip(".")
            if not any(c in line[m.start():m.end() + 1] for c in "*<{") and not path.startswith(IGNORED):
                out.append((n, path))
    return out


def sources() -> list[Path]:
    return sorted([ROOT / "README.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("bench/**/*.md"),
                   *ROOT.glob("bench/*.py"), *ROOT.glob("examples/**/*.md"), *ROOT.glob("examples/**/*.py")])


def test_every_cited_repository_path_exists() -> None:
    missing = [f"{f.relative_to(ROOT)}:{n}: {p}" for f in sources() for n, p in cited(f.read_text())
               if not (ROOT / p).exists()]
    assert not missing, "cited but missing:\n" + "\n".join(missing)


def test_the_scan_finds_a_missing_path_and_skips_templates() -> None:
    text = ("see `tests/test_gone.py` and tests/test_doc_paths.py.\n- `tests/test_engine_*.py` and "
            "`tests/test_<name>.py`; saved to `bench/results/x.json`\n")
    assert cited(text) == [(1, "tests/test_gone.py"), (1, "tests/test_doc_paths.py")]
    assert [p for _, p in cited(text) if not (ROOT / p).exists()] == ["tests/test_gone.py"]
