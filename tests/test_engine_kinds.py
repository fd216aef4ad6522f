"""Engine kinds (engines/kinds/): one flavour = client backend + server half. A toy flavour written here (its
backend, its server half and a tiny stdlib HTTP server script) is launched through the real `LocalLauncher` and
`tailsieve launch`, moved between pools, reloaded by restart and asked for a completion by the real client; the
SGLang server half's command lines are pinned flag by flag (no SGLang server is started); the registry refuses
duplicates and unknown names in one line; the Ray launcher composes `Serving` instead of inheriting the local one."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tailsieve.cli import main
from tailsieve.engines.kinds import KINDS, Device, ServerHalf, ServerLaunch, SpecCounterNames, get_kind, register_kind
from tailsieve.engines.kinds.sglang import SGLangServer
from tailsieve.engines.kinds.vllm import VLLM_COUNTERS
from tailsieve.engines.launch import LocalLauncher, RayLauncher, make_launcher
from tailsieve.engines.launch.config import LaunchConfig, PoolEngine, launch_from_mapping
from tailsieve.engines.launch.process import pick_port
from tailsieve.engines.launch.ray_launcher import RayActors, bundle
from tailsieve.engines.launch.serving import Serving
from tailsieve.engines.measure.spec_measure import SpecCounters, counter_names
from tailsieve.engines.transport.backends import BACKENDS, EngineBackend, SGLangBackend, get_backend
from tailsieve.engines.transport.engine_client import ClientOptions, Endpoint, EngineClient, Request, SamplingParams
from tailsieve.engines.transport.sglang_native import SGLangNativeBackend
from tailsieve.errors import ConfigError
from tailsieve.model.speculative import SpecConfig, SpecMethod
from tailsieve.policy.step import Pool
from tailsieve.registry import DuplicateName

pytestmark = pytest.mark.timeout(120)

# ---- the toy flavour: everything a contributor writes for a new engine kind ---------------------------------------
TOY_SERVER = r'''
import json, os, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
argv = sys.argv[1:]
opt = {argv[k]: argv[k + 1] for k in range(0, len(argv) - 1) if argv[k].startswith("--")}
with open(os.environ["TOY_RECORD"], "a") as fh:
    fh.write(json.dumps({"argv": argv, "env": {k: v for k, v in os.environ.items() if k.startswith("TOY_")}}) + "\n")

class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def reply(self, obj):
        data = json.dumps(obj).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data))); self.end_headers(); self.wfile.write(data)
    def do_GET(self):
        if self.path == "/ping":
            return self.reply({"ok": True})
        self.send_response(404); self.end_headers()
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n = int(body.get("max_tokens") or body.get("steps"))
        if self.path == "/v1/completions":  # the launcher's warm-up
            return self.reply({"choices": [{"index": 0, "text": "w" * n, "finish_reason": "length"}],
                               "usage": {"prompt_tokens": 1, "completion_tokens": n}})
        if self.path == "/toy/generate":  # the toy's own protocol
            return self.reply({"out": opt["--name"] + ":" + body["input"], "steps": n, "draft": opt.get("--draft")})
        self.send_response(404); self.end_headers()

ThreadingHTTPServer((opt["--bind"], int(opt["--listen"])), H).serve_forever()
'''
TOY_COUNTERS = SpecCounterNames("toy_drafts", "toy_draft_tokens", "toy_accepted", "toy_accepted_at", "toy_tokens")


class ToyBackend(EngineBackend):
    """The toy's client half: `/toy/generate {"input", "steps"}` → `{"out", "steps"}`, mapped to the OpenAI shape."""

    health_paths: ClassVar[tuple[str, ...]] = ("/ping",)

    def path(self, options: ClientOptions) -> str:
        return "/toy/generate"

    def request_body(self, body: dict[str, Any], req: Request, options: ClientOptions) -> dict[str, Any]:
        return {"input": req.prompt, "steps": body["max_tokens"]}

    def response(self, data: Any, req: Request) -> Any:
        return {"choices": [{"index": 0, "text": data["out"], "finish_reason": "length"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": data["steps"]}}


class ToyServer(ServerHalf):
    """The toy's server half: its own flag names, environment, speculative flag, health path and counters. A
    flavour module decorates it, `@register_kind("toy", backend=ToyBackend)`; here the `toy` fixture makes the same
    call for one test at a time, so other test modules never see the toy."""

    health_path = "/ping"
    shown_env = ("TOY_",)
    spec_counters = TOY_COUNTERS
    tokenizer_flag = "--toy-tokenizer"
    tensor_parallel_flags = ("--shards",)
    script: ClassVar[Path | None] = None  # written by the `toy` fixture

    def default_command(self) -> tuple[str, ...]:
        assert self.script is not None
        return (sys.executable, str(self.script))

    def command(self, launch: ServerLaunch, head: tuple[str, ...]) -> list[str]:
        return [*head, "--weights", launch.model, "--bind", launch.host, "--listen", launch.port,
                "--name", launch.served_model_name or "toy", *launch.args, *launch.pool_flags]

    def env(self, launch: ServerLaunch, environ: Mapping[str, str]) -> dict[str, str]:
        return {"TOY_PLACE": str(launch.place), "TOY_RELOAD": "1" if launch.weight_reload else "0"}

    def spec_flags(self, spec: SpecConfig, extra: Mapping[str, Any]) -> tuple[str, ...]:
        return ("--draft", f"{spec.method.value}x{spec.depth}") if spec.enabled else ()

    def check_pool(self, spec: SpecConfig, extra: Mapping[str, Any], kind: str) -> None:
        if extra:
            raise ConfigError(f"the toy takes no speculative keys, got {', '.join(sorted(extra))}")


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The toy kind registered, its server script on disk; the record file its starts append to (returned)."""
    register_kind("toy", backend=ToyBackend)(ToyServer)
    script = tmp_path / "toy_server.py"
    script.write_text(TOY_SERVER, encoding="utf-8")
    monkeypatch.setattr(ToyServer, "script", script)
    record = tmp_path / "toy.jsonl"
    monkeypatch.setenv("TOY_RECORD", str(record))
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    yield record
    KINDS.pop("toy")
    BACKENDS.pop("toy")


def toy_cfg(tmp_path: Path, **kw: Any) -> LaunchConfig:
    base: dict[str, Any] = {"model": str(tmp_path / "model"), "kind": "toy", "replicas": 2, "places": ("0", "1"),
                            "served_model_name": "t", "tail": PoolEngine(SpecConfig(SpecMethod.NGRAM, 3)),
                            "tail_replicas": 1, "warmup_tokens": 4, "startup_timeout_s": 30.0, "grace_s": 3.0}
    return LaunchConfig(**(base | kw))


def rows(record: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in record.read_text().splitlines()]


def test_a_toy_flavour_launches_moves_reloads_and_serves_through_the_real_paths(toy: Path, tmp_path: Path) -> None:
    la = LocalLauncher(toy_cfg(tmp_path), tmp_path / "logs")
    assert la.replicas[1].engine.flags() == ("--draft", "ngramx3") and la.replicas[0].engine.flags() == ()
    with la:
        started = rows(toy)
        script = str(ToyServer.script)
        assert sorted(r["argv"] for r in started) == sorted(la.command(r)[la.command(r).index(script) + 1:]
                                                            for r in la.replicas)
        tail = next(r for r in started if "--draft" in r["argv"])
        assert tail["argv"][-2:] == ["--draft", "ngramx3"]
        assert tail["argv"][:2] == ["--weights", str(tmp_path / "model")]
        assert tail["env"] == {"TOY_PLACE": "1", "TOY_RECORD": str(toy), "TOY_RELOAD": "0"}
        assert la.health() == [True, True] and all(r.state == "up" and r.boot_s > 0 for r in la.replicas)

        async def ask(url: str) -> tuple[str, int]:
            async with EngineClient(ClientOptions(stream=False)) as c:
                done = await c.complete(Endpoint(url, "toy"), "t", Request("r0", "hello"), SamplingParams(max_tokens=5))
            return done.choices[0].text, done.choices[0].tokens

        assert asyncio.run(ask(la.endpoints[1])) == ("t:hello", 5)  # the toy's own protocol, through its backend
        assert la.assign([0]) > 0.0  # replica 0 joins the tail pool, replica 1 leaves it: both restart
        moved = rows(toy)[2:]
        assert sorted(tuple(r["argv"][-2:]) for r in moved) == sorted([("--draft", "ngramx3"), ("--name", "t")])
        la.reload(str(tmp_path / "model"), [1])  # a weight update by restart keeps the tokenizer with the toy's flag
        assert rows(toy)[-1]["argv"][-3:] == ["t", "--toy-tokenizer", str(tmp_path / "model")]
    assert not any(r.alive() for r in la.replicas)


def test_the_toy_through_tailsieve_launch(toy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "launch.toml"
    cfg.write_text(f'[spec.tail]\nmethod = "mtp"\ntokens = 2\n[launch]\nmodel = "{tmp_path / "model"}"\nkind = "toy"\n'
                   'replicas = 2\ncores = ["0", "1"]\ntail_replicas = 1\n', encoding="utf-8")
    assert main(["launch", "--config", str(cfg), "--ports", "18950,18951", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = f"{sys.executable} {ToyServer.script} --weights {tmp_path / 'model'} --bind 127.0.0.1"
    assert lines[0] == "# replica 0 (bulk) http://127.0.0.1:18950  env: TOY_PLACE=0 TOY_RECORD=" + str(toy) \
        + " TOY_RELOAD=0"
    assert lines[1].endswith(f"{head} --listen 18950 --name toy") and lines[3].endswith(
        f"{head} --listen 18951 --name toy --draft mtpx2")
    p0 = pick_port("127.0.0.1")
    p1 = pick_port("127.0.0.1", {p0})
    assert main(["launch", "--config", str(cfg), "--ports", f"{p0},{p1}", "--out", str(tmp_path / "out"),
                 "--duration", "0.2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["stopped"] and doc["endpoints"] == [f"http://127.0.0.1:{p0}", f"http://127.0.0.1:{p1}"]
    assert [r["flags"] for r in doc["replicas"]] == [[], ["--draft", "mtpx2"]] and len(rows(toy)) == 2


# ---- registry ---------------------------------------------------------------------------------------------------
def test_a_kind_registers_its_backend_and_names_are_refused_once_taken(toy: Path) -> None:
    assert BACKENDS["toy"] is ToyBackend and isinstance(get_backend("toy"), ToyBackend)
    assert get_kind("toy").backend is ToyBackend and isinstance(get_kind("toy").server, ToyServer)
    assert isinstance(get_kind("sglang").server, SGLangServer) and get_kind("sglang").backend is SGLangBackend
    assert get_kind("sglang-native").backend is SGLangNativeBackend
    with pytest.raises(DuplicateName, match=r"^engine kind 'toy' is already registered \(EngineKind\); choose another"):
        register_kind("toy", backend=ToyBackend)(SGLangServer)
    assert isinstance(get_kind("toy").server, ToyServer)  # the refused kind changed nothing
    register_kind("toy", backend=ToyBackend)(ToyServer)  # the same kind again: a no-op
    with pytest.raises(ConfigError) as err:
        LaunchConfig(model="m", kind="tgi")
    assert str(err.value) == "launch.kind: unknown engine kind 'tgi' (valid: sglang, sglang-native, toy, vllm)"
    with pytest.raises(ConfigError, match=r"^launch.kind: unknown engine kind 'tgi' \(valid: sglang, "):
        launch_from_mapping({"model": "m", "kind": "tgi"}, SpecConfig(), SpecConfig())
    with pytest.raises(ConfigError, match="^launch.kind must be str, got 5$"):
        launch_from_mapping({"model": "m", "kind": 5}, SpecConfig(), SpecConfig())


def test_counter_names_follow_the_endpoints_kind(toy: Path) -> None:
    assert counter_names(Endpoint("http://h:1", "vllm")) is VLLM_COUNTERS
    assert counter_names(Endpoint("http://h:1", "openai")) is VLLM_COUNTERS  # client-only: vLLM's names
    assert counter_names(Endpoint("http://h:1", "sglang")) is None  # SGLang counts no drafts: nothing is read
    assert counter_names(Endpoint("http://h:1", "toy")) is TOY_COUNTERS
    text = ("toy_drafts 4\ntoy_draft_tokens 12\ntoy_accepted 6\ntoy_tokens 30\n"
            'toy_accepted_at{position="0"} 4\ntoy_accepted_at{position="1"} 2\n')
    assert SpecCounters.parse(text, TOY_COUNTERS) == SpecCounters(4.0, 12.0, 6.0, 30.0, (4.0, 2.0))
    assert SpecCounters.parse(text) is None  # vLLM's names find nothing in the toy's metrics


# ---- SGLang's server half (command lines pinned; no SGLang server runs here) ----------------------------------
def sglang(**kw: Any) -> LaunchConfig:
    return LaunchConfig(**({"model": "org/m", "kind": "sglang", "replicas": 2, "base_port": 30000,
                            "tail_replicas": 1} | kw))


def test_sglang_gpu_command_lines_with_eagle3_on_the_tail() -> None:
    cfg = sglang(device=Device.GPU, memory=0.8, served_model_name="pol", args=("--tp-size", "2"),
                 tail=PoolEngine(SpecConfig(SpecMethod.EAGLE3, 3), (("model", "org/draft"),)),
                 bulk=PoolEngine(SpecConfig(SpecMethod.NGRAM, 4)))
    la = LocalLauncher(cfg, Path("/tmp/unused"))
    base = [sys.executable, "-m", "sglang.launch_server", "--model-path", "org/m", "--host", "127.0.0.1", "--port"]
    common = ["--served-model-name", "pol", "--mem-fraction-static", "0.8", "--tp-size", "2"]
    assert la.command(la.replicas[0]) == [*base, "30000", *common, "--speculative-algorithm", "NGRAM",
                                          "--speculative-num-draft-tokens", "4"]
    assert la.command(la.replicas[1]) == [*base, "30001", *common, "--speculative-algorithm", "EAGLE3",
                                          "--speculative-draft-model-path", "org/draft", "--speculative-num-steps", "3",
                                          "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
    env = la.env(la.replicas[1])
    assert env["CUDA_VISIBLE_DEVICES"] == "1"
    assert not [k for k in env if k.startswith(("VLLM_", "SGLANG_")) and k not in os.environ]
    assert bundle(cfg, 0) == {"CPU": 1.0, "GPU": 2.0}  # --tp-size counts a replica's GPUs on a Ray fleet


def test_sglang_cpu_command_environment_and_dry_run(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = sglang(places=("0-1", "2"), tail=PoolEngine(SpecConfig(SpecMethod.MTP, 2), (("eagle_topk", 2),)))
    la = LocalLauncher(cfg, Path("/tmp/unused"))
    cmd = la.command(la.replicas[1])
    assert cmd[cmd.index("--port"):] == ["--port", "30001", "--device", "cpu", "--speculative-algorithm", "EAGLE",
                                         "--speculative-num-steps", "2", "--speculative-eagle-topk", "2",
                                         "--speculative-num-draft-tokens", "3"]
    env = la.env(la.replicas[0])
    assert env["SGLANG_USE_CPU_ENGINE"] == "1" and env["SGLANG_CPU_OMP_THREADS_BIND"] == "0-1"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in env and "--enforce-eager" not in cmd  # no vLLM defaults leak in
    assert la.dry_run()[0] == ("# replica 0 (bulk) http://127.0.0.1:30000  env: SGLANG_CPU_OMP_THREADS_BIND=0-1 "
                               "SGLANG_USE_CPU_ENGINE=1")
    assert main(["launch", "--model", "org/m", "--kind", "sglang-native", "--replicas", "1", "--base-port", "30100",
                 "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines()[1].endswith(
        "-m sglang.launch_server --model-path org/m --host 127.0.0.1 --port 30100 --device cpu")


@pytest.mark.parametrize(("spec", "table", "msg"), [
    (SpecConfig(SpecMethod.SUFFIX, 4), {}, "launch.tail: engine kind sglang cannot speculate with suffix (valid: "
                                           "eagle3, mtp, ngram)"),
    (SpecConfig(SpecMethod.EAGLE3, 4), {}, "launch.tail: speculative method eagle3 needs a draft model: set "
                                           "speculative.model (a folder or hub id) for this pool"),
    (SpecConfig(SpecMethod.NGRAM, 4), {"tail": {"speculative": {"num_steps": 2}}},
     "launch.tail: speculative.num_steps comes from the spec table; do not repeat it"),
    (SpecConfig(), {"memory": 2}, "launch.memory on cpu has no SGLang setting: leave it out and put "
                                  "--max-total-tokens or --mem-fraction-static in launch.args"),
])
def test_sglang_refusals_are_one_line(spec: SpecConfig, table: dict[str, Any], msg: str) -> None:
    """The `[launch]` table of a config file with `kind = "sglang"`: each refusal names its key."""
    with pytest.raises(ConfigError) as err:
        launch_from_mapping({"model": "org/m", "kind": "sglang", "tail_replicas": 1} | table, spec, SpecConfig())
    assert str(err.value) == msg
    if spec.method is SpecMethod.SUFFIX:  # vLLM runs the same pool; a programmatic pool is re-checked for its kind
        assert PoolEngine(spec).flags()[0] == "--speculative-config"
        with pytest.raises(ConfigError, match="^launch.tail: engine kind sglang cannot speculate with suffix"):
            sglang(tail=PoolEngine(spec))


def test_the_same_pool_is_spelled_by_each_kind(toy: Path) -> None:
    """One pool (ngram, 3 tokens) on three kinds: each server half spells it, the shared checks stay shared."""
    spec = SpecConfig(SpecMethod.NGRAM, 3)
    assert PoolEngine(spec, kind="vllm").flags() == ("--speculative-config",
                                                     '{"method": "ngram", "num_speculative_tokens": 3}')
    assert PoolEngine(spec, kind="sglang").flags() == ("--speculative-algorithm", "NGRAM",
                                                       "--speculative-num-draft-tokens", "3")
    assert PoolEngine(spec, kind="toy").flags() == ("--draft", "ngramx3")
    with pytest.raises(ConfigError, match="^speculative options prompt_lookup_max given for a pool without spec"):
        PoolEngine(SpecConfig(), (("prompt_lookup_max", 4),), kind="sglang")


def test_the_ray_launcher_composes_serving_and_does_not_inherit_the_local_one(tmp_path: Path) -> None:
    assert not issubclass(RayLauncher, LocalLauncher)
    la = make_launcher("ray", sglang(ray="auto", device=Device.GPU, args=("--tp", "4")), tmp_path)
    assert isinstance(la, RayLauncher) and isinstance(la.serving, Serving) and isinstance(la.serving.site, RayActors)
    lines = la.dry_run()
    assert lines[1] == "# replica 0 (bulk) placement group bundle {'CPU': 1.0, 'GPU': 4.0}"
    assert lines[2].endswith("--model-path org/m --host NODE_IP --port 30000 --tp 4")
    assert la.pools == (Pool.BULK, Pool.TAIL)


def test_the_built_in_kinds_alone_outside_a_toy_test() -> None:
    """The toy fixture leaves the registries as it found them (the CLI's --kind choices, the docs' help blocks)."""
    assert sorted(KINDS) == ["sglang", "sglang-native", "vllm"] and "toy" not in BACKENDS


def test_rollout_launch_gives_its_clients_the_launched_kind(toy: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "launch.toml"
    cfg.write_text(f'[launch]\nmodel = "{tmp_path / "model"}"\nkind = "toy"\n', encoding="utf-8")
    (tmp_path / "p.jsonl").write_text('{"id": "a", "prompt": "x"}\n', encoding="utf-8")
    argv = ["rollout", "--launch", str(cfg), "--prompts", str(tmp_path / "p.jsonl"), "--out", str(tmp_path / "o")]
    assert main([*argv, "--kind", "vllm"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (f"tailsieve rollout: error: --kind vllm contradicts launch.kind = 'toy' of {cfg}: the launched "
                   "servers' kind is their clients' kind") and not (tmp_path / "o").exists()
