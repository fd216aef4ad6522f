"""The restart policy both launchers share (`engines/launch/restart.py`): try times and status lines."""

from __future__ import annotations

import pytest

from tailsieve.engines.launch.restart import MAX_DELAY_S, RestartPolicy


def policy(*, retries: int = 3, backoff_s: float = 1.0) -> RestartPolicy:
    return RestartPolicy(retries, backoff_s)


def test_first_try_at_once_then_doubling_back_off_capped_at_30_s() -> None:
    p = policy(backoff_s=1.5)
    assert [p.delay_s(k) for k in range(1, 8)] == [0.0, 1.5, 3.0, 6.0, 12.0, 24.0, MAX_DELAY_S]
    assert policy(backoff_s=0.0).delay_s(5) == 0.0
    assert MAX_DELAY_S == 30.0


def test_status_lines_name_the_replica_and_what_happens_next() -> None:
    p = policy()
    line = p.death("replica 0 (bulk pool, port 8000, pid 42)", "killed by signal SIGKILL", "no error in its log",
                   "/logs/r0.log", "process group reaped")
    assert line == ("replica 0 (bulk pool, port 8000, pid 42) killed by signal SIGKILL: no error in its log; "
                    "process group reaped; restarting (up to 3 tries); the other replicas keep serving "
                    "(log: /logs/r0.log)")
    off = policy(retries=0).death("replica 1 (http://10.0.0.2:8001)", "exited with code 1", "ValueError: x", "l")
    assert off == ("replica 1 (http://10.0.0.2:8001) exited with code 1: ValueError: x; not restarting; "
                   "the other replicas keep serving (log: l)")
    assert p.failed_try(2, 1, "port 8002 still in use") == "replica 2 restart 1/3 failed: port 8002 still in use"
    assert p.back("replica 0 (port 8000)", 25.04, 1, 23.44) == (
        "replica 0 (port 8000) back in service 25.0s after it died (restart 1/3, start-up 23.4s)")
    assert p.stays_down("replica 0 (port 8000)", 3) == (
        "replica 0 (port 8000) stays down: 3 restart(s) failed; the other replicas keep serving")
    assert policy(retries=0).stays_down("replica 0 (port 8000)", 0).endswith("stays down: restarts are off; "
                                                                            "the other replicas keep serving")


@pytest.mark.parametrize("attempt", [0, -3])
def test_attempts_below_one_are_immediate(attempt: int) -> None:
    assert policy().delay_s(attempt) == 0.0
