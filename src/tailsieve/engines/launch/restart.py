"""The restart policy both launchers share (docs/launch.md, "Replica deaths"): when a replica that died is tried
again, and the status lines its death, a failed try, its return and a give-up print. The local launcher runs it in
one thread per death, the Ray launcher in its watchdog loop; the policy itself holds no state."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tailsieve.engines.launch.bounds import MAX_BACKOFF_S as MAX_DELAY_S
from tailsieve.engines.launch.config import LaunchConfig

__all__ = ["MAX_DELAY_S", "RestartPolicy"]


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """`retries` tries in a row; the first at once, try k ≥ 2 after `backoff_s` · 2^(k−2) s, at most 30 s."""

    retries: int
    backoff_s: float

    @classmethod
    def of(cls, config: LaunchConfig) -> RestartPolicy:
        """The policy of a launch config (`restart_retries`, `restart_backoff_s`)."""
        return cls(config.restart_retries, config.restart_backoff_s)

    def delay_s(self, attempt: int) -> float:
        """Seconds to wait before restart try `attempt` (1-based)."""
        return 0.0 if attempt <= 1 else min(MAX_DELAY_S, self.backoff_s * 2.0 ** (attempt - 2))

    def death(self, who: str, how: str, error: str, log: Path | str, extra: str = "") -> str:
        """The line for a death: who, how it ended (exit code or signal), the server's error, what happens next."""
        nxt = f"restarting (up to {self.retries} tries)" if self.retries else "not restarting"
        mid = f"{extra}; " if extra else ""
        return f"{who} {how}: {error}; {mid}{nxt}; the other replicas keep serving (log: {log})"

    def failed_try(self, index: int, attempt: int, error: object) -> str:
        """The line for a restart try that failed."""
        return f"replica {index} restart {attempt}/{self.retries} failed: {error}"

    def back(self, where: str, back_s: float, attempt: int, boot_s: float) -> str:
        """The line for a replica serving again."""
        return (f"{where} back in service {back_s:.1f}s after it died (restart {attempt}/{self.retries}, "
                f"start-up {boot_s:.1f}s)")

    def gave_up(self, tries: int) -> str:
        """Why a replica stays down."""
        return f"{tries} restart(s) failed" if tries else "restarts are off"

    def stays_down(self, where: str, tries: int) -> str:
        """The line for a replica whose restarts gave up."""
        return f"{where} stays down: {self.gave_up(tries)}; the other replicas keep serving"
