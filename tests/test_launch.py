"""`LocalLauncher` with fake server processes (tests/fake_vllm_proc.py): commands and placement per pool, config-file
tables and their errors, start-up failures (crash, port in use, timeout), pool moves that restart only when flags
differ, SIGTERM → SIGKILL, the warm-up generation and the engine's death line. The CLI (`tailsieve launch`, `rollout
--launch`): tests/test_launch_cli.py; what both share: tests/launch_harness.py. The launcher interface itself
(explicit tail ids, the pool hook, the registry): tests/test_launcher_seam.py."""

from __future__ import annotations

import json
import socket
import time
from dataclasses import replace
from pathlib import Path

import pytest

from launch_harness import NGRAM, fake_cfg, gone, write_cfg
from tailsieve.engines.launch import LaunchError
from tailsieve.engines.launch import LocalLauncher as Launcher
from tailsieve.engines.launch.config import Device, LaunchConfig, PoolEngine, check_model, load_launch_config
from tailsieve.engines.launch.process import server_error
from tailsieve.errors import ConfigError
from tailsieve.model.spec_parse import load_config_file
from tailsieve.model.speculative import SpecConfig, SpecMethod
from tailsieve.policy.step import Pool

pytestmark = pytest.mark.timeout(120)




# ---- commands, placement, configuration (no processes) ------------------------------------------------------------
def test_cpu_commands_pin_cores_and_only_tail_replicas_speculate(model: Path, tmp_path: Path) -> None:
    cfg = LaunchConfig(model=str(model), replicas=3, tail_replicas=1, places=("0", "1", "2-3"), memory=2, tail=NGRAM,
                       served_model_name="tiny", args=("--max-model-len", "4096"))
    la = Launcher(cfg, tmp_path)
    cmds = [la.command(r) for r in la.replicas]
    assert [r.pool for r in la.replicas] == [Pool.BULK, Pool.BULK, Pool.TAIL]
    assert all(c[:2] == ["taskset", "-c"] for c in cmds) and [c[2] for c in cmds] == ["0", "1", "2-3"]
    assert cmds[0][-5:-2] == ["--enforce-eager", "--max-num-batched-tokens", "16384"]
    spec = cmds[2][cmds[2].index("--speculative-config") + 1]
    assert json.loads(spec) == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
    assert "--speculative-config" not in cmds[0] + cmds[1] and "--served-model-name" in cmds[0]
    env = la.env(la.replicas[2])
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "2-3" and env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert env["HF_HUB_OFFLINE"] == "1" and len({r.port for r in la.replicas}) == 3


def test_gpu_commands_use_visible_devices_and_memory_share(model: Path, tmp_path: Path) -> None:
    cfg = LaunchConfig(model=str(model), replicas=2, device=Device.GPU, places=("0,1", "2,3"), memory=0.45,
                       base_port=9100, args=("--enforce-eager",))
    la = Launcher(cfg, tmp_path)
    c = la.command(la.replicas[1])
    assert c[0] != "taskset" and c[c.index("--gpu-memory-utilization") + 1] == "0.45"
    assert c.count("--enforce-eager") == 1 and "--max-num-batched-tokens" not in c
    assert la.env(la.replicas[1])["CUDA_VISIBLE_DEVICES"] == "2,3" and la.endpoints[1].endswith(":9101")


def test_config_file_tables(model: Path, tmp_path: Path) -> None:
    path = tmp_path / "cfg.toml"
    path.write_text(f'[spec.tail]\nmethod = "ngram"\ntokens = 3\n[spec.bulk]\nmethod = "none"\n'
                    f'[launch]\nmodel = "{model}"\nreplicas = 2\ncores = ["0", "1"]\nmemory = 1\ntail_replicas = 1\n'
                    f'[launch.tail]\nspeculative = {{ prompt_lookup_max = 4 }}\nargs = ["--seed", "1"]\n')
    cfg = load_launch_config(path)
    assert cfg.tail.flags()[-2:] == ("--seed", "1") and cfg.tail.speculative_config() == {
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
    assert cfg.bulk.flags() == () and not cfg.restart_free and cfg.places == ("0", "1")
    assert load_config_file(path).tail.method is SpecMethod.NGRAM  # the simulator reads the same file


@pytest.mark.parametrize(("launch", "pool", "msg"), [
    ('replicas = 2\nbogus = 1', "", "unknown key launch.bogus"),
    ('device = "gpu"\ncores = ["0"]', "", "launch.cores does not apply to device gpu"),
    ("memory = 1.5", "", "KV cache in whole GiB"),
    ("tail_replicas = 2", "", "tail_replicas must lie in [0, 1]"),
    ("ports = [8000, 8000]", "", "repeats a port"),
    ("", "[launch.bulk]\nspeculative = { prompt_lookup_max = 4 }", "without speculation"),
    ("", "[launch.tail]\nspeculative = { num_speculative_tokens = 4 }", "comes from the spec table"),
])
def test_config_errors_are_one_line(model: Path, tmp_path: Path, launch: str, pool: str, msg: str) -> None:
    path = tmp_path / "cfg.toml"
    path.write_text(f'[spec.tail]\nmethod = "ngram"\n[launch]\nmodel = "{model}"\n{launch}\n{pool}\n')
    with pytest.raises(ConfigError, match=msg.replace("[", r"\[")) as e:
        load_launch_config(path)
    assert "\n" not in str(e.value)


def test_draft_model_methods_need_a_model() -> None:
    with pytest.raises(ConfigError, match="eagle3 needs a draft model"):
        PoolEngine(SpecConfig(SpecMethod.EAGLE3, 3))
    assert PoolEngine(SpecConfig(SpecMethod.EAGLE3, 3), (("model", "org/draft"),)).flags()[0] == "--speculative-config"


def test_check_model(model: Path, tmp_path: Path) -> None:
    check_model(str(model))
    check_model("meta-llama/Llama-3.1-8B")  # a hub id: the server resolves it
    with pytest.raises(ConfigError, match="does not exist"):
        check_model(str(tmp_path / "missing"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="no config.json"):
        check_model(str(tmp_path / "file"))


def test_server_error_picks_the_exception_line(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_text("INFO x\nWARNING found error in ulimit\npydantic_core._pydantic_core.ValidationError: 1 validation "
                   "error for SpeculativeConfig\n  Value error, no draft model. [type=value_error, input=…]\n  For…\n")
    assert server_error(log) == ("pydantic_core._pydantic_core.ValidationError: 1 validation error for "
                                 "SpeculativeConfig: Value error, no draft model.")
    log.write_text("NotImplementedError: Unsupported speculative method: 'mtp'\n(EngineCore pid=3) shutting down\n")
    assert server_error(log) == "NotImplementedError: Unsupported speculative method: 'mtp'"


# ---- fake server processes ----------------------------------------------------------------------------------------
def test_start_assign_and_stop(running: Launcher, record: Path) -> None:
    la = running
    rows = [json.loads(x) for x in record.read_text().splitlines()]
    assert {r["env"]["VLLM_CPU_OMP_THREADS_BIND"] for r in rows} == {"0", "1"}
    assert all(r["env"]["VLLM_CPU_KVCACHE_SPACE"] == "1" for r in rows) and la.m == 0
    pids = [r.proc.pid for r in la.replicas if r.proc]
    t = la.assign([1])  # replica 1 moves to the tail pool: its flags differ → restarted (only it)
    assert t > 0 and la.m == 1 and la.replicas[1].restarts == 1 and la.replicas[0].restarts == 0
    assert la.replicas[0].proc and la.replicas[0].proc.pid == pids[0] and gone(pids[1])
    last = json.loads(record.read_text().splitlines()[-1])
    assert "--speculative-config" in last["argv"] and last["port"] == la.replicas[1].port
    assert la.assign((1,)) == 0.0 and la.restart_s_total == pytest.approx(t)
    assert la.assign([]) > 0 and la.replicas[1].pool is Pool.BULK
    with pytest.raises(LaunchError, match=r"tail pool of 2 replica\(s\) leaves no bulk replica \(at most 1 of 2\)"):
        la.assign([0, 1])
    with pytest.raises(LaunchError, match=r"tail replica 2 is not a replica id in \[0, 1\]"):
        la.assign([2])
    alive = [r.proc.pid for r in la.replicas if r.proc]
    tmp = Path(rows[0]["env"]["TMPDIR"])  # short: vLLM's ZMQ IPC paths must stay under 107 characters
    assert len(str(tmp)) < 60 and tmp.is_dir()
    la.stop()
    assert all(gone(p) for p in alive) and not tmp.parent.exists()


def test_identical_pools_never_restart(model: Path, tmp_path: Path, record: Path) -> None:
    with Launcher(fake_cfg(model), tmp_path / "logs") as la:
        pid = la.replicas[1].proc.pid if la.replicas[1].proc else 0
        assert la.config.restart_free and la.assign([1]) == 0.0 and la.m == 1
        assert la.replicas[1].proc and la.replicas[1].proc.pid == pid
    assert gone(pid)


def test_crash_during_start_up_stops_the_others(model: Path, tmp_path: Path, record: Path) -> None:
    cfg = fake_cfg(model, tail_replicas=1, tail=PoolEngine(args=("--fake-crash",)),
                   bulk=PoolEngine(args=("--fake-boot", "0.5")))
    la = Launcher(cfg, tmp_path / "logs")
    with pytest.raises(LaunchError) as e:
        la.start()
    msg = str(e.value)
    assert "replica 1 (tail pool, port" in msg and "ValueError: fake engine failed to start" in msg
    assert "\n" not in msg and all(r.proc is not None and gone(r.proc.pid) for r in la.replicas)


def test_port_in_use_is_refused_before_anything_starts(model: Path, tmp_path: Path, record: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        la = Launcher(fake_cfg(model, ports=(port + 0, port + 1) if port < 65000 else (port, port - 1)), tmp_path)
        with pytest.raises(LaunchError, match=f"port {port} \\(replica 0\\) is in use"):
            la.start()
    assert all(r.proc is None for r in la.replicas) and not record.exists()


def test_start_up_timeout(model: Path, tmp_path: Path, record: Path) -> None:
    la = Launcher(fake_cfg(model, startup_timeout_s=1.0, bulk=PoolEngine(args=("--fake-boot", "20"))), tmp_path)
    with pytest.raises(LaunchError, match="not healthy after 1s"):
        la.start()
    assert all(r.proc is not None and gone(r.proc.pid) for r in la.replicas)


@pytest.mark.slow
def test_sigkill_after_grace_and_children_reaped(model: Path, tmp_path: Path, record: Path) -> None:
    cfg = fake_cfg(model, grace_s=0.5, bulk=PoolEngine(args=("--fake-ignore-term", "--fake-child")))
    la = Launcher(cfg, tmp_path).start()
    pids = [r.proc.pid for r in la.replicas if r.proc]
    t0 = time.monotonic()
    la.stop()
    assert time.monotonic() - t0 < 5 and all(gone(p) for p in pids)
    la.stop()  # idempotent


def test_warm_up_generation_after_health(model: Path, tmp_path: Path) -> None:
    """After /health each replica generates `warmup_tokens` once (a fresh server's first batch is slow); servers
    asking for an API key are left cold; any other failure is a one-line LaunchError."""
    from engine_fake import FakeServer

    with FakeServer() as ok, FakeServer(mode="500") as broken, FakeServer(mode="401") as locked:
        cfg = fake_cfg(model, ports=(ok.port, broken.port), served_model_name="tiny")
        la = Launcher(cfg, tmp_path / "logs")
        la._warm_up(la.replicas[0])
        assert ok.bodies == [{"model": "tiny", "prompt": "Hello", "max_tokens": 16, "temperature": 0.0,
                              "ignore_eos": True}]
        with pytest.raises(LaunchError, match=r"replica 1 \(port \d+\) is healthy but failed its warm-up generation: "
                                              r"HTTP 500"):
            la._warm_up(la.replicas[1])
        off = Launcher(replace(cfg, warmup_tokens=0), tmp_path / "l2")
        off._warm_up(off.replicas[0])
        assert len(ok.bodies) == 1  # warmup_tokens = 0: nothing sent
        key = Launcher(replace(cfg, ports=(locked.port, ok.port)), tmp_path / "l3")
        key._warm_up(key.replicas[0])  # 401: the server wants an API key, left cold without an error
        assert locked.started == 1
    with pytest.raises(ConfigError, match="launch.warmup_tokens must be an integer in 0..4096, got -1"):
        fake_cfg(model, warmup_tokens=-1)
    assert load_launch_config(write_cfg(tmp_path, model, "warmup_tokens = 0\n")).warmup_tokens == 0
    with pytest.raises(ConfigError, match="launch.warmup_tokens must be an integer in 0..4096, got 'x'"):
        load_launch_config(write_cfg(tmp_path, model, 'warmup_tokens = "x"\n'))


# issue 23: the death line quotes the engine's own error. Generated: log shape class x variant -> the quoted line.
DEAD = "EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause."
TAG, HEAD = "(APIServer pid=7) ", "ERROR 05-01 10:00:00 [async_llm.py:480] "
LOG_CLASSES: dict[str, list[tuple[str, str]]] = {
    "vllm-prefixed": [(f"{TAG}{HEAD}{DEAD}\n{TAG}INFO 05-01 10:00:01 [launcher.py:1] Shutting down.\n", DEAD),
                      (f"\x1b[1;36m{TAG}\x1b[0;0m{HEAD}{DEAD}\n", DEAD),
                      (f"{TAG}vllm.v1.engine.exceptions.{DEAD}\n", f"vllm.v1.engine.exceptions.{DEAD}"),
                      ("(EngineCore_DP0 pid=9) CRITICAL 05-01 10:00:00 [core.py:9] EngineCore failed to start.\n",
                       "EngineCore failed to start.")],
    "crash": [("INFO x\nFatal Python error: Illegal instruction\n\nCurrent thread 0x1 (most recent call first):\n"
               '  File "attn.py", line 3 in cpu_attention_with_kv_cache\n', "Fatal Python error: Illegal instruction"),
              ("AmxPermissionError: arch_prctl(...) failed: errno 1 (x)\nFatal Python error: Illegal instruction\n",
               "Fatal Python error: Illegal instruction (AmxPermissionError: arch_prctl(...) failed: errno 1 (x))"),
              (f"{TAG}{HEAD}{DEAD}\nFatal Python error: Segmentation fault\n",
               "Fatal Python error: Segmentation fault")],
    "earlier-run": [("ValueError: the previous start failed\n== tailsieve launch: python -m x\nINFO serving\n",
                     "no error in its log"),
                    ("Fatal Python error: Aborted\n== tailsieve ray launch: python -m x\nKeyError: 'now'\n",
                     "KeyError: 'now'")],
}
LOG_CASES = [(c, text, want) for c, cases in LOG_CLASSES.items() for text, want in cases]


@pytest.mark.parametrize(("cls", "text", "want"), LOG_CASES, ids=[f"{c}-{k}" for k, (c, _, _) in enumerate(LOG_CASES)])
def test_generated_death_lines_quote_the_engine_error(cls: str, text: str, want: str, tmp_path: Path) -> None:
    log = tmp_path / "replica-0.log"
    log.write_text(text)
    assert server_error(log, last_line=False) == want
