"""Secrets are never printed (issue 49 item 1): the value-shaped redactor (`tailsieve.redact`) on its own, every
line the CLI prints or logs about user or server content (argparse errors, error lines, launch command lines and
launch.json, lock holders, the progress variable, `family:` specs), and a property test that feeds random secret
shapes embedded in random text through every error path and finds no byte of the secret in the output.

Each class is generated over the shapes the fourth hostile corpus found leaking (19 cases) and the bare token
formats; the targets: no secret, no escape sequence (`\\x1b`), no line over 300 characters from user content."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from cli_inprocess import run
from tailsieve.outputs import OutputLock
from tailsieve.redact import EXCERPT_CHARS, MASK, clip, excerpt, redact, shown_args

LINE_CHARS = 300  # the longest line the CLI may print about user content

# (text, the secret it holds): the corpus's leaking shapes and every bare token format
SHAPES: dict[str, tuple[str, str]] = {
    "Authorization: Token": ("Authorization: Token tok3n-value-42", "tok3n-value-42"),
    "Authorization: Bearer, two parts": ("authorization: Bearer abc.def ghi-jkl", "ghi-jkl"),
    "quoted password, two words": ('password: "correct horse battery"', "correct horse battery"),
    "single-quoted secret": ("client_secret = 'two words here'", "two words here"),
    "DB_PASSWORD with a semicolon": ("DB_PASSWORD=abc;Xyz-rest", "Xyz-rest"),
    "X-Auth-Token header": ("X-Auth-Token: opaque value 123", "opaque value 123"),
    "Cookie header": ("Cookie: session=s3ss10n-id; theme=dark", "s3ss10n-id"),
    "Set-Cookie header": ("Set-Cookie: sid=9f8e7d6c; Path=/; HttpOnly", "9f8e7d6c"),
    "URL password with @": ("https://admin:p@ss@w0rd!@db.internal:5432/x", "ss@w0rd!"),
    "JSON api_key": ('{"api_key": "k-123 456", "model": "m"}', "k-123 456"),
    "--api-key flag": ("serve --api-key hunter2-flag --port 1", "hunter2-flag"),
    "--password='…' flag": ("run --password='a b c' next", "a b c"),
    # a value quoted inside an escaped string: a repr (found by the property test below) or JSON of a command line
    "escaped single quotes (a repr)": ("args: ' HF_TOKEN=\\'s3cr3t val\\' \"'", "s3cr3t val"),
    "escaped double quotes (JSON)": ('{"cmd": "serve --api-key \\"k3y-v4l\\" --port 1"}', "k3y-v4l"),
    "sk-": ("key sk-abcdefghijklmnop0123 here", "sk-abcdefghijklmnop0123"),
    "sk-proj-": ("sk-proj-AbCdEfGhIjKlMnOpQrStUv", "sk-proj-AbCdEfGhIjKlMnOpQrStUv"),
    "hf_": ("model hf_abcdefghijklmnopqrstuvwxyzABCDEFGH", "hf_abcdefghijklmnopqrstuvwxyzABCDEFGH"),
    "ghp_": ("ghp_0123456789abcdefghijABCDEFGHIJ012345", "ghp_0123456789abcdefghijABCDEFGHIJ012345"),
    "gho_": ("(gho_0123456789abcdefghijABCDEFGHIJ)", "gho_0123456789abcdefghijABCDEFGHIJ"),
    "github_pat_": ("pat github_pat_11ABCDEFG0_abcdefghijklmnopqrstuv", "github_pat_11ABCDEFG0_abcdefghijklmnopqrstuv"),
    "xoxb-": ("slack xoxb-123456789012-abcdefABCDEF", "xoxb-123456789012-abcdefABCDEF"),
    "xoxp-": ("xoxp-1234-5678-9012-abcdef", "xoxp-1234-5678-9012-abcdef"),
    "AKIA": ("aws AKIAIOSFODNN7EXAMPLE.", "AKIAIOSFODNN7EXAMPLE"),
    "JWT": ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpM",
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpM"),
}
# text that must keep its words: file paths and key paths are not secrets
PLAIN = ("config /etc/app/secret.toml: [controller] unknown key z", "--config my_secret.toml", "max_tokens=4096",
         "--max-tokens 512", "--api-key-env HF_TOKEN", "verl session: cannot start", "missing key 'lengths'",
         "tokens: 3 of 8", "/data/keys/token_counts.csv")


class TestRedactor:
    """The redactor masks the whole value of every shape, in every quoting function, and keeps paths readable."""

    @pytest.mark.parametrize("shape", list(SHAPES))
    def test_the_whole_value_is_masked(self, shape: str) -> None:
        text, secret = SHAPES[shape]
        for out in (redact(text), clip(text), excerpt(text), redact(f"before; {text}\nafter")):
            assert secret not in out and MASK in out, (shape, out)

    @pytest.mark.parametrize("text", PLAIN)
    def test_paths_and_plain_keys_stay_readable(self, text: str) -> None:
        assert redact(text) == text

    @pytest.mark.parametrize("shape", list(SHAPES))
    def test_a_long_value_is_an_excerpt_without_escapes(self, shape: str) -> None:
        text, secret = SHAPES[shape]
        out = excerpt("\x1b[31m" + text + "\x07" + "Z" * 100_000)
        assert secret not in out and "\x1b" not in out and "\x07" not in out and len(out) <= EXCERPT_CHARS + 40



def clean(secret: str, *texts: str) -> None:
    """No secret, no control character (beyond newlines), no line over LINE_CHARS characters."""
    for text in texts:
        assert secret not in text, text[-600:]
        assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f\x9b]", text), text[-600:]
        assert all(len(line) <= LINE_CHARS for line in text.splitlines()), max(text.splitlines(), key=len)[:400]


# one secret per shape family, with an escape sequence after it (what reached the terminal)
CLI_SECRETS = {k: SHAPES[k] for k in ("Authorization: Token", "quoted password, two words", "URL password with @",
                                      "sk-proj-", "ghp_", "JWT")}


@contextlib.contextmanager
def held_lock(target: Path, holder: str) -> Iterator[None]:
    """Another run's lock on `target`, its lock file naming `holder`."""
    target.mkdir(parents=True, exist_ok=True)
    fd = os.open(target / ".tailsieve.lock", os.O_RDWR | os.O_CREAT, 0o666)
    try:
        os.write(fd, holder.encode())
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        os.close(fd)


class TestEveryPrintedLine:
    """Every printed line about user content, generated over secret shapes × the paths that printed them."""

    @pytest.mark.parametrize("shape", list(CLI_SECRETS))
    @pytest.mark.parametrize("flag", ["--steps", "--groups", "--replay", "--rho"])
    def test_argparse_errors(self, shape: str, flag: str) -> None:
        text, secret = CLI_SECRETS[shape]
        rc, out, err = run(["simulate", flag, text + "\x1b]0;owned\x07" + "Q" * 100_000])
        assert rc in (1, 2) and len(err.splitlines()) == 1, err[:400]
        clean(secret, out, err)

    @pytest.mark.parametrize("shape", list(CLI_SECRETS))
    @pytest.mark.parametrize("where", ["--curve", "family spec", "--workload"])
    def test_error_lines_quoting_a_name(self, shape: str, where: str) -> None:
        text, secret = CLI_SECRETS[shape]
        value = f"family:{text}\x1b[2J" if where == "family spec" else f"{text}\x1b[2J"
        rc, out, err = run(["simulate", "--workload" if where == "--workload" else "--curve", value, "--steps", "2"])
        assert rc != 0 and len(err.splitlines()) == 1, err[:400]
        clean(secret, out, err)

    @pytest.mark.parametrize("shape", list(CLI_SECRETS))
    def test_the_progress_variable(self, shape: str) -> None:
        text, secret = CLI_SECRETS[shape]
        rc, out, err = run(["simulate", "--steps", "2", "--policy", "uniform"],
                           env={"TAILSIEVE_PROGRESS": text + "\x1b[31m"})
        assert rc != 0, err
        clean(secret, out, err)

    @pytest.mark.parametrize("shape", list(CLI_SECRETS))
    def test_another_runs_lock_holder(self, shape: str, tmp_path: Path) -> None:
        text, secret = CLI_SECRETS[shape]
        holder = json.dumps({"command": text + "\x1b[31m" + "W" * 1_000, "pid": 7, "host": text, "since": text})
        with held_lock(tmp_path / "out", holder), pytest.raises(Exception) as caught:
            OutputLock(tmp_path / "out", "rollout", folder=True).check()
        clean(secret, str(caught.value).replace(str(tmp_path), "DIR"))  # the holder part: short

    @pytest.mark.parametrize("shape", list(CLI_SECRETS))
    @pytest.mark.parametrize("flag", ["--server-args", "--tail-args", "--bulk-args"])
    def test_launch_dry_run_command_lines(self, shape: str, flag: str) -> None:
        key = CLI_SECRETS[shape][1].replace(" ", "-")
        args = f"--api-key {key} --max-model-len 100 --hf-token={key}x"
        rc, out, err = run(["launch", "--dry-run", "--model", "facebook/opt-125m", "--replicas", "2", "--m", "1",
                            f"{flag}={args}"])
        assert rc == 0 and "--max-model-len 100" in out, err
        clean(key, out, err)

    def test_launch_an_argument_that_ends_in_a_secret_flag(self) -> None:
        """A shell-escaped blank makes `0 --api-key` one argument (found by the property test below): the argument
        after it is still the flag's value, masked in the dry run and in `shown_args` (not after `--api-key-env`)."""
        rc, out, err = run(["launch", "--dry-run", "--model", "facebook/opt-125m", "--replicas", "1",
                            "--server-args=0\\ --api-key s3cr3t-v4lue"])
        assert rc == 0 and f"'0 --api-key' {MASK}" in out, err
        clean("s3cr3t-v4lue", out, err)
        argv = ["0 --api-key", "k3y-value", "x --hf-token", "t0ken-value", "y --api-key-env", "HF_TOKEN"]
        assert shown_args(argv) == ["0 --api-key", MASK, "x --hf-token", MASK, "y --api-key-env", "HF_TOKEN"]

    def test_launch_an_argument_that_ends_in_a_secret_name(self) -> None:
        """The same blank before a secret name (found by the property test below): `'0 HF_TOKEN' = 000000` is the name,
        its `=` and the value, three arguments; the value is masked, as after `HF_TOKEN =`, and after `'0 HF_TOKEN='`
        as after `HF_TOKEN=`."""
        rc, out, err = run(["launch", "--dry-run", "--model", "facebook/opt-125m", "--replicas", "1",
                            '--server-args=0\\ HF_TOKEN = "000000" '])
        assert rc == 0 and f"'0 HF_TOKEN' = {MASK}" in out, err
        clean("000000", out, err)
        assert shown_args(["0 HF_TOKEN", "=", "v4lue-one", "x HF_TOKEN=", "v4lue-two", "y HF_TOKEN", "shown"]) == [
            "0 HF_TOKEN", "=", MASK, "x HF_TOKEN=", MASK, "y HF_TOKEN", "shown"]

    @pytest.mark.parametrize("shape", ["sk-proj-", "quoted password, two words", "ghp_"])
    def test_launch_json_and_the_replica_log_header(self, shape: str, tmp_path: Path) -> None:
        """launch.json (`describe`: the pools' args) and the header each replica log starts with (a real launch's
        spawn, its server a process that exits at once)."""
        from tailsieve.cli import build_parser
        from tailsieve.cli.launch_cmd import launch_config
        from tailsieve.engines.launch import LocalLauncher

        key = SHAPES[shape][1].replace(" ", "-")
        ns = build_parser(only="launch").parse_args([
            "launch", "--model", "facebook/opt-125m", "--replicas", "2", "--m", "1", f"--server-args=--api-key {key}",
            f"--tail-args=--hf-token={key}", "--config", str(self._command_file(tmp_path))])
        launcher = LocalLauncher(launch_config(ns)[0], tmp_path / "logs")
        assert key not in json.dumps(launcher.describe())
        (tmp_path / "logs").mkdir()
        for rep in launcher.replicas:
            launcher.serving.site.spawn(rep)
            assert rep.proc is not None
            rep.proc.wait(timeout=30)
            log = rep.log.read_text()
            assert "== tailsieve launch:" in log and "--port" in log, log
            clean(key, log)
        launcher.stop()

    @pytest.mark.parametrize("shape", list(CLI_SECRETS))
    def test_a_replica_logs_error_line(self, shape: str, tmp_path: Path) -> None:
        """The error a launch quotes from a replica's log (a server that echoes its own flags when it fails)."""
        from tailsieve.engines.launch.process import server_error

        text, secret = CLI_SECRETS[shape]
        log = tmp_path / "replica-0.log"
        log.write_text(f"INFO 05-01 10:00:00 [api_server.py:1] args: {text}\n"
                       f"ValueError: bad flags: {text}\x1b[31m {'V' * 5000}\n")
        clean(secret, server_error(log))

    @staticmethod
    def _command_file(tmp_path: Path) -> Path:
        """A launch config whose server command is `true` (the replica exits at once; its log keeps the header)."""
        path = tmp_path / "launch.toml"
        path.write_text('[launch]\ncommand = ["true"]\n')
        return path


# ------------------------------------------------------------------------------------------------ property test

TOKEN = st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789", min_size=20, max_size=40)
# (a value shaped like a documentation placeholder, `<TOKEN>` or `{api_key}`, is shown: it is not a secret)
VALUE = st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789!#$%()*+,./:;<>?@[]^_`{|}~-=",
                min_size=6, max_size=30).filter(lambda v: re.search(r"[A-Za-z0-9]{3}", v) is not None
                                                and not re.fullmatch(r"<[A-Za-z_]*>|\{[A-Za-z_]*\}", v))
QUOTED = st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 !#$%()*+,./:;<>?@[]^_{|}~-=",
                 min_size=6, max_size=30).filter(lambda v: re.search(r"[A-Za-z0-9]{3}", v) is not None)
NAMES = st.sampled_from(["HF_TOKEN", "OPENAI_API_KEY", "api_key", "db.password", "AWS_SECRET_ACCESS_KEY",
                         "X-Auth-Token", "client_secret", "MY_CREDENTIALS", "passwd", "access_token"])
USERINFO = st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789@!$%*+,;=:._~-", min_size=6,
                   max_size=30).filter(lambda v: re.search(r"[A-Za-z0-9]{3}", v) is not None)


@st.composite
def secret_shapes(draw: st.DrawFn) -> tuple[str, str]:
    """(a text holding a secret, the secret)."""
    kind = draw(st.integers(0, 7))
    if kind == 0:
        prefix = draw(st.sampled_from(["sk-", "sk-proj-", "hf_", "ghp_", "gho_", "github_pat_", "xoxb-", "xoxp-"]))
        secret = prefix + draw(TOKEN)
        return secret, secret
    if kind == 1:
        secret = "AKIA" + draw(st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", min_size=16, max_size=16))
        return secret, secret
    if kind == 2:
        secret = "eyJ" + draw(TOKEN) + ".eyJ" + draw(TOKEN) + "." + draw(TOKEN)
        return secret, secret
    if kind == 3:
        value = draw(VALUE)
        return f"{draw(NAMES)}={value}", value
    if kind == 4:
        value = draw(QUOTED)
        q = draw(st.sampled_from(['"', "'"]))
        return f"{draw(NAMES)}{draw(st.sampled_from([': ', '=', ' = ']))}{q}{value}{q}", value
    if kind == 5:
        value = draw(QUOTED).strip() or "x-secret-value"
        header = draw(st.sampled_from(["Authorization: Bearer ", "Authorization: Token ", "Cookie: session=",
                                       "Set-Cookie: id=", "X-Api-Key: ", "Proxy-Authorization: Basic "]))
        return header + value, value
    if kind == 6:
        value = draw(USERINFO)
        return f"https://user:{value}@host.example:8000/v1", value
    value = draw(VALUE.filter(lambda v: not v.startswith("-")))
    return f"--api-key {value}", value


FILLER = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00", max_codepoint=0x2FFF),
                 max_size=60)
SEP = st.sampled_from([" ", "\n", "; ", ", ", " (", "\t"])


def error_paths(text: str, words: str) -> Iterator[str]:
    """Everything one text reaches: the quoting functions and the CLI's error lines (argparse, a bad curve name, a
    bad family spec, a bad progress variable), and a launch's server arguments (`words`: the secret a word of its
    own, as a shell splits an argument string)."""
    yield redact(text)
    yield excerpt(text)
    yield clip(text)
    for argv, env in ((["simulate", "--steps", text], None), (["simulate", "--curve", text, "--steps", "2"], None),
                      (["simulate", "--curve", f"family:{text}", "--steps", "2"], None),
                      (["simulate", "--steps", "2"], {"TAILSIEVE_PROGRESS": text}),
                      (["launch", "--dry-run", "--model", "facebook/opt-125m", "--replicas", "1",
                        f"--server-args={words}"], None)):
        _, out, err = run(argv, env)
        yield out + err


@functools.cache
def fixed_text() -> str:
    """What the error paths print of their own for a harmless input ("x"): a secret that is a piece of it (the
    generated value "tailsi" of the program's name, seen in CI) cannot be told from the message itself."""
    return "\n".join(error_paths("x", "x"))


@settings(max_examples=150, deadline=None, database=None)
@given(before=FILLER, sep1=SEP, shape=secret_shapes(), sep2=SEP, after=FILLER)
def test_no_secret_byte_survives_any_error_path(before: str, sep1: str, shape: tuple[str, str], sep2: str,
                                                after: str) -> None:
    text, secret = shape
    assume(secret not in before + after and secret not in fixed_text())
    full = before + sep1 + text + sep2 + after
    for out in error_paths(full, f"{before} {text} {after}"):
        assert secret not in out, (full, out[-400:])
