"""Hostile files at every input path (issue 41 items 6 and 7): each kind of file that is not what an input must be
(a FIFO with no writer, /dev/zero, a symlink to a device, a directory, a file over the size cap, a /proc file whose
st_size says 0, files full of secrets and long lines: environ, .env, JSON and TOML shapes) given to each input flag
of each command, in-process through tests/hostile_harness.py. Every case exits non-zero in one line naming the file
and why, within the harness's alarm (a FIFO or an endless device never hangs, nothing is read past the cap), and the
line never quotes a secret or more than `EXCERPT_CHARS` characters of the file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

import tailsieve.inputs
from hostile_harness import (
    prompt_file,
    report_outcomes,  # noqa: F401 (the module's autouse fixture: outcome counts)
    rollout_base,
    run_case,
    scratch,
    small_trace,
    write,
)
from tailsieve.redact import EXCERPT_CHARS, MASK, excerpt, redact

SHAPE = ["--steps", "1", "--groups", "3", "--group-size", "2", "--replicas", "2"]
ENDPOINTS = ["--endpoints", "http://127.0.0.1:1,http://127.0.0.1:2"]


def _rollout(root: Path, *extra: str) -> list[str]:
    return [*rollout_base(root, prompt_file(root)), *extra]


def _resume(name: str) -> Callable[[Path], Path]:
    return lambda root: root / "out" / "uniform" / name


Argv = Callable[[Path, str], list[str]]
# Each input flag of each command: how the command line is built around the hostile path, and (for the files a
# command finds by itself, not by flag) where the hostile file is put.
FLAGS: dict[str, tuple[Argv, Callable[[Path], Path] | None]] = {
    "curves CURVE": (lambda r, p: ["curves", p, "--json"], None),
    "analyze WORKLOAD": (lambda r, p: ["analyze", p], None),
    "simulate --curve": (lambda r, p: ["simulate", "--curve", p, "--workload", small_trace(r), *SHAPE], None),
    "simulate --workload": (lambda r, p: ["simulate", "--workload", p, *SHAPE], None),
    "simulate --config": (lambda r, p: ["simulate", "--config", p, "--workload", small_trace(r), *SHAPE], None),
    "plan --curve": (lambda r, p: ["plan", "--curve", p, "--workload", small_trace(r), *SHAPE], None),
    "plan --workload": (lambda r, p: ["plan", "--workload", p, *SHAPE], None),
    "route --workload": (lambda r, p: ["route", "--workload", p, "--groups", "3", "--group-size", "2"], None),
    "route --curve": (lambda r, p: ["route", "--curve", p, "--workload", small_trace(r), "--groups", "3"], None),
    "oracle --workload": (lambda r, p: ["oracle", "--workload", p, "--sample", "4", "--repeat", "2"], None),
    "oracle --curve": (lambda r, p: ["oracle", "--curve", p, "--workload", small_trace(r), "--sample", "4"], None),
    "profile --plain-curve": (lambda r, p: ["profile", "--endpoint", "http://127.0.0.1:9", "--plain-curve", p,
                                            "--method", "mtp", "--out", str(r / "m.json")], None),
    "rollout --prompts": (lambda r, p: [*rollout_base(r, p)], None),
    "rollout --replay-lengths": (lambda r, p: _rollout(r, "--replay-lengths", p), None),
    "rollout --curve": (lambda r, p: _rollout(r, "--curve", p), None),
    "rollout --launch": (lambda r, p: [a for a in rollout_base(r, prompt_file(r)) if a not in ENDPOINTS]
                         + ["--launch", p], None),
    "rollout --resume state.json": (lambda r, p: _rollout(r, "--resume"), _resume("state.json")),
    "rollout --resume steps.jsonl": (lambda r, p: _rollout(r, "--resume"), _resume("steps.jsonl")),
    "launch --config": (lambda r, p: ["launch", "--config", p, "--dry-run", "--out", str(r / "launch")], None),
}

SECRETS = {"AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI-K7MDENG-bPxRfiCY", "HF_TOKEN": "hf_qwertyuiopasdfghjkl",
           "GITHUB_TOKEN": "ghp_zxcvbnmlkjhgfdsa1234", "DB_PASSWORD": "correct-horse-battery",
           "OPENAI_API_KEY": "sk-proj-0123456789abcdef"}
LONG = "Z" * 300  # a run no error may quote whole


def _secret_text(shape: str) -> bytes:
    """A file of secret-bearing pairs: /proc/self/environ (NUL-separated), a .env file, JSON or TOML."""
    pairs = [*SECRETS.items(), ("PAD", LONG)]
    if shape == "environ":
        return b"\0".join(f"{k}={v}".encode() for k, v in pairs) + b"\0"
    if shape == "dotenv":
        return "".join(f"{k}={v}\n" for k, v in pairs).encode()
    if shape == "json":
        return ("{" + ", ".join(f'"{k}": "{v}"' for k, v in pairs) + "}\n").encode()
    return "".join(f'{k} = "{v}"\n' for k, v in pairs).encode()  # toml


CAP = 65_536  # the lowered size cap of the oversized kinds (the bundled traces and prompts stay below it)
PROC = "/proc/self/maps"  # st_size 0, yet longer than PROC_CAP in a process that imported numpy
PROC_CAP = 4096  # above the small inputs the cases pass beside the hostile one
# Each hostile kind: how it is made at `target` and the text its error must hold.
KINDS: dict[str, tuple[str, ...]] = {
    "fifo": ("a FIFO (named pipe), not a regular file",),
    "dev-zero": ("a character device, not a regular file",),
    "symlink-to-device": ("a character device, not a regular file",),
    "directory": ("directory",),
    "oversized": (f"more than the {CAP:,} bytes allowed",),
    "proc-file": ("bytes allowed",),
    "secret-environ": (),
    "secret-dotenv": (),
    "secret-json": (),
    "secret-toml": (),
}


def make(kind: str, target: Path) -> str:
    """Create the hostile input at `target` (or name a system file) and return the path to pass."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "dev-zero":
        if target.parent.name != "uniform":  # a flag takes /dev/zero itself; a resume file must sit in the folder
            return "/dev/zero"
        target.symlink_to("/dev/zero")
    elif kind == "symlink-to-device":
        target.symlink_to("/dev/null")
    elif kind == "directory":
        target.mkdir()
    elif kind == "oversized":
        row = b'{"prompt_id": "a", "length": 5, "prompt": "q"}\n'
        target.write_bytes(row * (CAP // len(row) + 2))
    elif kind == "proc-file":
        target.symlink_to(PROC)  # a regular file whose st_size is 0
    else:
        target.write_bytes(_secret_text(kind.removeprefix("secret-")))
    return str(target)


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("flag", sorted(FLAGS))
def test_hostile_file_at_every_input(flag: str, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    argv_of, fixed = FLAGS[flag]
    cap = PROC_CAP if kind == "proc-file" else CAP
    monkeypatch.setattr(tailsieve.inputs, "MAX_FILE_BYTES", cap)
    with scratch() as root:
        suffix = ".json" if "secret-json" in kind else ".toml" if "secret-toml" in kind else ".jsonl"
        target = fixed(root) if fixed is not None else root / f"input{suffix}"
        path = make(kind, target)
        argv = argv_of(root, path)
        rc, err = run_case(f"files {kind}", argv, root)
        assert rc != 0, (flag, kind)
        shown = str(target) if path != "/dev/zero" else path
        moved = target.name == "steps.jsonl" and f"{target.parent}: step 0 was not committed" in err
        assert shown in err or moved, (flag, kind, err)  # moved: one unfinished line, set aside (docs/engines.md)
        assert all(e in err for e in KINDS[kind]), (flag, kind, err)
        assert not any(v in err for v in SECRETS.values()), (flag, kind, err)
        assert "Z" * (EXCERPT_CHARS + 1) not in err, (flag, kind, err)


def test_every_input_flag_is_covered() -> None:
    """The table names every command's file-taking flag (a new one must be added here)."""
    commands = {f.split()[0] for f in FLAGS}
    assert commands == {"curves", "analyze", "simulate", "plan", "route", "oracle", "profile", "rollout", "launch"}
    assert len(FLAGS) == 19 and len(KINDS) == 10


@pytest.mark.parametrize("size", [CAP - 1, CAP, CAP + 1])
def test_the_cap_is_read_not_stat(size: int, tmp_path: Path) -> None:
    """A regular file of exactly the cap is read; one byte more is refused: by reading, on a path fstat cannot size
    (/proc) as on one it can."""
    p = tmp_path / "f.txt"
    p.write_bytes(b"x" * size)
    if size <= CAP:
        assert tailsieve.inputs.read_text(p, "file", max_bytes=CAP) == "x" * size
        return
    with pytest.raises(tailsieve.inputs.ConfigError, match=f"file {p}: more than the {CAP:,} bytes allowed"):
        tailsieve.inputs.read_text(p, "file", max_bytes=CAP)
    proc = Path(PROC)
    assert proc.stat().st_size == 0 and len(proc.read_bytes()) > PROC_CAP
    with pytest.raises(tailsieve.inputs.ConfigError, match=f"more than the {PROC_CAP:,} bytes allowed"):
        tailsieve.inputs.read_text(proc, "file", max_bytes=PROC_CAP)


def test_a_gzip_bomb_of_prompts_stops_at_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cap counts decompressed text: a small .gz of endless zeros is refused, not inflated into memory."""
    import gzip

    monkeypatch.setattr(tailsieve.inputs, "MAX_FILE_BYTES", CAP)
    with scratch() as root:
        bomb = write(root, "p.jsonl.gz", gzip.compress(b"\0" * (CAP * 16)))
        assert os.path.getsize(bomb) < CAP // 4
        rc, err = run_case("files gzip", rollout_base(root, bomb), root)
        assert rc == 1 and f"prompt file {bomb}: more than the {CAP:,} bytes allowed" in err


# ------------------------------------------------------------------ numbers a float64 cannot hold, named by key

BIG = "1" + "0" * 400  # 10^400: an integer to JSON and TOML, OverflowError wherever it meets a float
NUMBERS = {"json": (BIG, "-" + BIG, "1e400", "-1e999"), "toml": (BIG, "1e400", "nan", "inf", "-inf")}
MODEL = '{"batch": [1, 8], "tpot_ms": [2.0, 3.0], "cost_model": {"kv_ms_per_1k": 0.1, "prefill_ms_per_token": 0.01}}'
# (file name, the document with one placeholder per key, the keys, the command line)
DOCS: dict[str, tuple[str, tuple[str, ...], Argv]] = {
    "model.json": (MODEL, ("batch[1]", "tpot_ms[0]", "cost_model.kv_ms_per_1k", "cost_model.prefill_ms_per_token"),
                   lambda r, p: ["simulate", "--curve", p, "--workload", small_trace(r), *SHAPE]),
    "curve.json": ('{"batch": [1, 8], "tpot_ms": [2.0, 3.0]}', ("batch[0]", "tpot_ms[1]"),
                   lambda r, p: ["curves", p, "--json"]),
    "spec.toml": ('[spec.tail]\nmethod = "mtp"\ntokens = 2\nacceptance = 0.5\n',
                  ("spec.tail.tokens", "spec.tail.acceptance"),
                  lambda r, p: ["simulate", "--config", p, "--workload", small_trace(r), *SHAPE]),
    "launch.toml": ('[launch]\nmodel = "m"\ngrace_s = 3.0\nmemory = 2\nrestart_retries = 1\n',
                    ("launch.grace_s", "launch.memory", "launch.restart_retries"),
                    lambda r, p: ["launch", "--config", p, "--dry-run", "--out", str(r / "o")]),
}


def _number_cases() -> list[tuple[str, str, str]]:
    return [(doc, key, v) for doc, (_, keys, _) in DOCS.items() for key in keys
            for v in NUMBERS[doc.rsplit(".", 1)[1]]]


NUMBER_CASES = _number_cases()


def _set(doc: str, text: str, key: str, value: str) -> str:
    """`text` with `key`'s value replaced by the literal `value` (JSON: the path's leaf; TOML: the line)."""
    leaf = key.rsplit(".", 1)[-1]
    if doc.endswith(".toml"):
        return "\n".join(f"{leaf} = {value}" if ln.startswith(f"{leaf} =") else ln for ln in text.splitlines()) + "\n"
    obj = json.loads(text)
    name, _, index = leaf.partition("[")
    parent = obj["cost_model"] if key.startswith("cost_model.") else obj
    if index:
        parent[name][int(index[:-1])] = "@"
    else:
        parent[name] = "@"
    return json.dumps(obj).replace('"@"', value)


@pytest.mark.parametrize(("doc", "key", "value"), NUMBER_CASES, ids=[f"{d}:{k}={v[:6]}" for d, k, v in NUMBER_CASES])
def test_a_number_a_float_cannot_hold_is_named_by_file_and_key(doc: str, key: str, value: str) -> None:
    text, _, argv_of = DOCS[doc]
    with scratch() as root:
        path = write(root, doc, _set(doc, text, key, value).encode())
        rc, err = run_case("files numbers", argv_of(root, path), root)
        assert rc == 1, err
        assert path in err and f"key '{key}' holds" in err and "not a finite number" in err, err
        assert len(err) < 300 and "OverflowError" not in err, err


def test_proc_self_environ_as_a_curve_quotes_no_secret() -> None:
    """The reported case, in its own process: /proc/self/environ (st_size 0, NUL-separated) as `--curve` is refused
    in one line that quotes at most EXCERPT_CHARS characters and no secret of the environment."""
    import subprocess
    import sys

    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.pathsep.join(sys.path)} | {
        k: v for k, v in SECRETS.items()}
    env["PAD"] = LONG
    done = subprocess.run([sys.executable, "-m", "tailsieve", "simulate", "--curve", "/proc/self/environ"],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    lines = done.stderr.splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert lines[0].startswith("tailsieve simulate: error: curve file /proc/self/environ: CSV header"), lines[0]
    assert not any(v in done.stderr for v in SECRETS.values()) and "Z" * (EXCERPT_CHARS + 1) not in done.stderr
    assert len(lines[0]) < 250, lines[0]


# ------------------------------------------------------------------------ redaction of secret-looking names

SECRET_SHAPES = ("{k}={v}", '"{k}": "{v}"', "{k} = \"{v}\"", "{k}: {v}", "'{k}': '{v}'", "export {k}={v};")
PLAIN = {"max_tokens": "4096", "tokens": "3", "warmup_tokens": "16", "monkey": "banana", "KEYBOARD": "us"}


@pytest.mark.parametrize("shape", SECRET_SHAPES)
@pytest.mark.parametrize("name", [*sorted(SECRETS), "api_key", "db_passwd", "GOOGLE_APPLICATION_CREDENTIALS"])
def test_secret_names_are_redacted_in_every_shape(name: str, shape: str) -> None:
    value = SECRETS.get(name, "pl41n-s3cret-value")
    # the secret last: a `NAME: value` masks to the end of its line (issue 49: `Authorization: Token X` is one value)
    text = " ".join(shape.format(k=k, v=v) for k, v in PLAIN.items()) + " " + shape.format(k=name, v=value)
    out = redact(text)
    assert value not in out and MASK in out and name in out, out
    assert all(v in out for v in PLAIN.values()), out  # ordinary names keep their values
    assert value not in excerpt(text) and len(excerpt(text * 5)) <= EXCERPT_CHARS + 30


@pytest.mark.parametrize("doc", sorted(DOCS))
def test_more_digits_than_python_converts_name_the_file(doc: str) -> None:
    """A 5000-digit number (past int()'s 4300-digit limit) fails inside the parser: still one line naming the file."""
    text, keys, argv_of = DOCS[doc]
    with scratch() as root:
        path = write(root, doc, _set(doc, text, keys[0], "9" * 5000).encode())
        rc, err = run_case("files digits", argv_of(root, path), root)
        assert rc == 1 and path in err and "invalid" in err and len(err) < 400, err
