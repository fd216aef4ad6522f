"""Prompt files and the paper's prompt templates (App. A.1).

`load_prompts` reads a bundled prompt set by name (`math500`: the first 200 MATH-500 problems, MIT,
data/ATTRIBUTION.md) or JSONL (optionally .gz) whose records name the text differently (`prompt`, `problem`,
`question`, `messages`, …) and the id differently (`id`, `question_id`, …). `render` applies a template:
`math` (one user message ending in the `<END>` protocol), `code` (the bounded-reasoning system + user messages),
or `none` (the text as is). `paper_sampling` is Table A.1's sampling configuration.
"""

from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass
from enum import StrEnum
from importlib import resources
from pathlib import Path
from typing import Any

from tailsieve.engines.transport.engine_client import SamplingParams
from tailsieve.errors import ConfigError
from tailsieve.inputs import clip, excerpt, loads_json, open_text

TEXT_FIELDS = ("prompt", "problem", "question", "instruction", "input", "query", "text", "content")
ID_FIELDS = ("id", "question_id", "task_id", "prompt_id", "uid", "global_id", "idx")
END = "<END>"

# App. A.1 prints the math message with its middle elided ("...<END> After <END>, stop immediately. ..."); the
# instruction before <END> is the common DeepScaleR one, reconstructed here.
MATH_USER = ("{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}, then write "
             "<END>.\nAfter <END>, stop immediately. Do not write any words, punctuation, newline, or explanation "
             "after <END>.")
CODE_SYSTEM = "You are an expert Python programmer."
CODE_USER = ("Solve the coding problem below.\nProvide your reasoning and explanation, including the key algorithm, "
             "its correctness, important edge cases, and its time and space complexity.\nThen provide exactly one "
             "complete Python function.\nAfter the function, write <END> and stop immediately.\nDo not repeat or "
             "revise the answer.\n\nProblem: {question}\nRequired function: {function_declaration}\n"
             "Specification: {docstring}")
# Prompt sets shipped inside the package (data/prompts/, licences in data/ATTRIBUTION.md), addressable by name.
BUNDLED_PROMPTS = {"math500": "data/prompts/math500.jsonl"}
_SIGNATURE = re.compile(r"def\s+\w+\s*\([^)]*\)\s*(?:->\s*[^:`\n]+)?:")

Messages = tuple[tuple[str, str], ...]


class Template(StrEnum):
    """Prompt template."""

    NONE = "none"
    MATH = "math"
    CODE = "code"


@dataclass(frozen=True, slots=True)
class PromptRecord:
    """One prompt: a unique id, its text or chat messages, and the record's other fields (for templates)."""

    prompt_id: str
    text: str
    messages: Messages | None = None
    fields: tuple[tuple[str, str], ...] = ()

    def field(self, name: str) -> str | None:
        """Another field of the source record, as text."""
        return dict(self.fields).get(name)


def paper_sampling(max_tokens: int = 16384) -> SamplingParams:
    """Table A.1: temperature 0.7, top-p 0.8, top-k 20, presence penalty 1.5, stop <END>, 16,384 tokens."""
    return SamplingParams(temperature=0.7, top_p=0.8, top_k=20, presence_penalty=1.5, max_tokens=max_tokens,
                          stop=(END,))


def _record(obj: Any, lineno: int, where: str) -> tuple[PromptRecord, bool]:
    """The record of one line, and whether its id is generated (`line-N`: the record has no id field)."""
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: line {lineno} is not a JSON object")
    key = next((k for k in ID_FIELDS if obj.get(k) is not None), None)
    if key is not None and isinstance(obj[key], bool | list | dict):
        raise ConfigError(f"prompt file {where}, line {lineno}: id '{key}' must be text or a number, got "
                          f"{clip(json.dumps(obj[key]))}")
    if key is not None and not str(obj[key]).strip():
        raise ConfigError(f"prompt file {where}, line {lineno}: id '{key}' is empty; give the prompt an id, or no "
                          "id field at all")
    pid = f"line-{lineno}" if key is None else str(obj[key])
    msgs = obj.get("messages")
    messages: Messages | None = None
    if isinstance(msgs, list) and msgs and all(isinstance(m, dict) and "content" in m for m in msgs):
        messages = tuple((str(m.get("role", "user")), str(m["content"])) for m in msgs)
    text = next((obj[k] for k in TEXT_FIELDS if isinstance(obj.get(k), str) and obj[k].strip()), None)
    if text is None and messages is None:
        raise ConfigError(f"{where}: line {lineno} has no prompt text (looked for {', '.join(TEXT_FIELDS)}, messages)")
    if text is None and messages is not None:
        text = messages[-1][1]
    fields = tuple((k, v if isinstance(v, str) else json.dumps(v)) for k, v in obj.items() if k != "messages")
    return PromptRecord(pid, str(text), messages, fields), key is None


def prompt_path(spec: str | Path) -> Path:
    """The file of a bundled prompt set's name (a name wins over a file of the same name), else `spec` itself."""
    if isinstance(spec, str) and spec in BUNDLED_PROMPTS:
        return Path(str(resources.files("tailsieve").joinpath(BUNDLED_PROMPTS[spec])))
    p = Path(spec)
    if not p.exists():
        raise ConfigError(f"prompt file {p} not found (bundled prompt sets: {', '.join(BUNDLED_PROMPTS)})")
    return p


def load_prompts(path: str | Path, *, limit: int | None = None) -> tuple[PromptRecord, ...]:
    """Prompts of a bundled set (`math500`) or a JSONL / JSONL.gz file in file order; duplicate ids get a `#k`
    suffix, a record without an id is `line-N`. An empty id, or an id that clashes with one of those generated
    ids, is a one-line `ConfigError` naming the file and line."""
    p = prompt_path(path)
    out: list[PromptRecord] = []
    seen: dict[str, int] = {}  # id in the file → times seen
    owner: dict[str, int] = {}  # id given → its line
    made: dict[str, int] = {}  # `line-N` id generated → its line
    try:
        with open_text(p, "prompt file", gz=p.suffix == ".gz") as fh:
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                obj = loads_json(line, f"prompt file {p}, line {lineno}", line=False)
                rec, generated = _record(obj, lineno, str(p))
                _check_generated(p, lineno, rec.prompt_id, generated, made, owner)
                k = seen.get(rec.prompt_id, 0)
                seen[rec.prompt_id] = k + 1
                if k:
                    rec = PromptRecord(f"{rec.prompt_id}#{k}", rec.text, rec.messages, rec.fields)
                if rec.prompt_id in owner:
                    raise ConfigError(f"prompt file {p}, line {lineno}: id {excerpt(rec.prompt_id)} is already the "
                                      f"id of line {owner[rec.prompt_id]} (a repeated id gets a #k suffix); give "
                                      "each prompt its own id")
                owner[rec.prompt_id] = lineno
                out.append(rec)
                if limit is not None and len(out) >= limit:
                    break
    except (OSError, EOFError, zlib.error) as exc:
        raise ConfigError(f"cannot read prompt file {p}: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"prompt file {p}: not UTF-8 text ({exc.reason})") from None
    if not out:
        raise ConfigError(f"prompt file {p} has no prompts")
    return tuple(out)


def _check_generated(p: Path, lineno: int, pid: str, generated: bool, made: dict[str, int],
                     owner: dict[str, int]) -> None:
    """A given id must not be one generated for a line without an id, nor a generated one a given id (one line
    naming both lines); a generated id is then recorded in `made`."""
    if not generated and pid in made:
        raise ConfigError(f"prompt file {p}, line {lineno}: id {excerpt(pid)} is the id generated for line "
                          f"{made[pid]}, which has no id; give that prompt an id, or this one another")
    if generated:
        if pid in owner:
            raise ConfigError(f"prompt file {p}, line {lineno} has no id, and the id it would get, {excerpt(pid)}, is "
                              f"the id of line {owner[pid]}; give this prompt an id")
        made[pid] = lineno


def render(rec: PromptRecord, template: Template) -> str | Messages:
    """The prompt to send: text (no template, single message) or chat messages (code template)."""
    if template is Template.NONE:
        return rec.messages if rec.messages is not None else rec.text
    if template is Template.MATH:
        return (("user", MATH_USER.format(problem=rec.text.strip())),)
    sig = rec.field("function_declaration")
    if not sig:
        m = _SIGNATURE.search(rec.text)
        sig = m.group(0) if m else "(as stated in the problem)"
    doc = rec.field("docstring") or "(as stated in the problem)"
    user = CODE_USER.format(question=rec.text.strip(), function_declaration=sig, docstring=doc)
    return (("system", CODE_SYSTEM), ("user", user))
