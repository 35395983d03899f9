"""CommandTarget on real child processes: waiting through a pidfd, and the stepped fallback."""

from __future__ import annotations

import logging
import os

import pytest

from runner.run.targets import CommandTarget
from runner.tasks import RunContext


def _ctx() -> RunContext:
    return RunContext(
        task="t", slot=None, fencing_token=1, holder="h",
        logger=logging.LoggerAdapter(logging.getLogger("t"), {}),
    )  # fmt: skip


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture(params=["pidfd", "stepped"])
def wait_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "stepped":
        # A kernel before 5.3 (or not Linux): Popen.wait(timeout) is what is left.
        def no_pidfd(pid: int) -> int:
            raise OSError(38, "Function not implemented")

        monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    return str(request.param)


def test_poll_reports_running_then_exited_with_the_code(wait_kind: str) -> None:
    before = _open_fds()
    target = CommandTarget(["sh", "-c", "sleep 0.2; exit 7"])
    target.start(_ctx())
    assert (target._pidfd is not None) == (wait_kind == "pidfd")
    # A long timeout: the poll must return when the child exits, not when the timeout ends
    # (a poll that slept through it would run into the per-test timeout).
    assert target.poll(300.0)
    assert target.exit_code() == 7
    assert target._pidfd is None
    assert _open_fds() == before


def test_poll_times_out_while_the_child_runs_and_kill_stops_it(wait_kind: str) -> None:
    before = _open_fds()
    target = CommandTarget(["sleep", "30"])
    target.start(_ctx())
    assert not target.poll(0.05)
    assert target.kill()
    assert target.exit_code() == 128 + 9
    assert _open_fds() == before
