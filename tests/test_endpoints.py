"""Endpoint URLs (issue 23): parsed once, strictly, every bad class refused in one line before any request (even
beside a working endpoint); good spellings normalize to one URL; `user:password@` credentials are sent as basic
auth, never shown in output or files, and refused together with an API key. Moved from test_reply_faults.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import all_text
from engine_fake import FakeServer
from tailsieve.cli import main
from tailsieve.engines.transport.engine_client import Endpoint

ENDPOINT_CLASSES: dict[str, list[tuple[str, str]]] = {  # class -> (URL, the reason in the one-line error)
    "port": [("http://127.0.0.1:abc", "port 'abc' is not an integer in 1..65535"),
             ("http://127.0.0.1:0", "port '0' is not an integer in 1..65535"),
             ("http://127.0.0.1:65536", "port '65536' is not an integer in 1..65535"),
             ("http://h:1:2", "port '1:2' is not an integer in 1..65535"),
             ("http://h:-1", "port '-1' is not an integer in 1..65535"),
             ("http://h:+80", "port '+80' is not an integer in 1..65535"),
             ("http://h:\uff18\uff10", "port '\uff18\uff10' is not an integer in 1..65535"),
             ("http://admin:pw-0123456@h:0", "port '0' is not an integer in 1..65535")],
    "scheme": [("ftp://h:1", "not an http or https URL"), ("127.0.0.1:8000", "not an http or https URL"),
               ("//h:1", "not an http or https URL"), ("http:/h:1", "not an http or https URL")],
    "host": [("http://:80", "host '' is not a host name or IP address"),
             ("http://h h:80", "host 'h h' is not a host name or IP address"),
             ("http://-h:80", "host '-h' is not a host name or IP address")],
    "credentials": [("http://:pw-0123456@h:80", "credentials without a user name")],
    "query": [("http://h:80/?x=1", "a query or fragment is not part of a base URL"),
              ("http://h:80#top", "a query or fragment is not part of a base URL")],
}
BAD_URLS = [(cls, url, why) for cls, cases in ENDPOINT_CLASSES.items() for url, why in cases]


@pytest.mark.parametrize(("cls", "url", "why"), BAD_URLS, ids=[f"{c}-{k}" for k, (c, _, _) in enumerate(BAD_URLS)])
def test_generated_bad_endpoints_are_refused_in_one_line(cls: str, url: str, why: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from tailsieve.engines.transport.types import BadEndpoint
    with pytest.raises(BadEndpoint) as info:
        Endpoint.parse(url)
    shown = str(info.value)
    assert why in shown and shown.endswith("expected http(s)://HOST:PORT") and "pw-0123456" not in shown
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"question_id": "q0", "question": "1+1?"}) + "\n")
    with FakeServer() as good:  # refused although another endpoint works, before any request
        rc = main(["rollout", "--endpoints", f"{good.url},{url}", "--prompts", str(prompts), "--groups", "2",
                   "--group-size", "2", "--out", str(tmp_path / "o")])
        assert good.started == 0
    err = capsys.readouterr().err.strip()
    assert rc == 1 and err.count("\n") == 0 and why in err and "pw-0123456" not in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(("given", "url"), [("http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000"),
                                           ("HTTP://h:0080", "http://h:80"), ("https://api.example.com", "https://api.example.com"),
                                           ("http://[::1]:8000", "http://[::1]:8000"), ("http://h/proxy/v1", "http://h/proxy")])
def test_good_endpoints_normalize_once(given: str, url: str) -> None:
    assert Endpoint.parse(given).url == url == Endpoint(given).url and Endpoint(url) == Endpoint.parse(given)


def test_url_credentials_are_sent_as_basic_auth_and_never_shown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    import base64
    monkeypatch.delenv("TAILSIEVE_API_KEY", raising=False)
    secret = "hunter2-very-secret"
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"question_id": f"q{i}", "question": f"{i}+1?"}) + "\n" for i in range(8)))
    with FakeServer() as a, FakeServer() as b:
        with_creds = [u.replace("http://", f"http://admin:{secret}@") for u in (a.url, b.url)]
        rc = main(["rollout", "--endpoints", ",".join(with_creds), "--prompts", str(prompts), "--groups", "2",
                   "--group-size", "2", "--max-tokens", "8", "--out", str(tmp_path / "run")])
        sent = {h.get("Authorization") for h in a.headers + b.headers}
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert sent == {"Basic " + base64.b64encode(f"admin:{secret}".encode()).decode()}
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["endpoints"] == [a.url, b.url]  # credential-free
    assert secret not in all_text(tmp_path, (cap.out, cap.err))
    dead = f"http://admin:{secret}@127.0.0.1:9"
    rc = main(["rollout", "--endpoints", dead, "--prompts", str(prompts), "--groups", "2", "--group-size", "2",
               "--give-up-after", "0.2", "--out", str(tmp_path / "dead")])
    rc2 = main(["profile", "--endpoint", dead, "--served-model-name", "m", "--batches", "1", "--retries", "0",
                "--out", str(tmp_path / "c.json")])
    cap = capsys.readouterr()
    assert rc == rc2 == 1 and "127.0.0.1:9" in cap.err and secret not in all_text(tmp_path, (cap.out, cap.err))


@pytest.mark.parametrize("command", ["rollout", "profile"])
def test_url_credentials_with_an_api_key_are_refused_in_one_line(command: str, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TAILSIEVE_API_KEY", "tsk-key-0123456789")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"question_id": "q0", "question": "1+1?"}) + "\n")
    with FakeServer() as srv:
        url = srv.url.replace("http://", "http://admin:pw-0123456@")
        rollout = ["rollout", "--endpoints", f"{url},{url}", "--prompts", str(prompts), "--groups", "2",
                   "--group-size", "2"]
        profile = ["profile", "--endpoint", url, "--served-model-name", "fake", "--batches", "1"]
        args = rollout if command == "rollout" else profile
        rc = main([*args, "--out", str(tmp_path / "o")])
        assert srv.started == 0
    err = capsys.readouterr().err.strip()
    assert rc == 1 and err.count("\n") == 0 and "pw-0123456" not in err
    assert err.endswith(f"endpoint {srv.url} carries user:password credentials and the API key variable "
                        "TAILSIEVE_API_KEY is set: give one of them")
