"""`serve` stops on the one stop flag (runner.signals): every stop signal ends it cleanly, as
SIGTERM does, with its port closed and exit 0, never killed mid-request by a default action."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.helpers.proc import runner_env
from tests.serve.conftest import serving


@pytest.mark.parametrize(
    "signum",
    [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1],
    ids=lambda s: signal.Signals(s).name,
)
def test_every_stop_signal_stops_serve_cleanly(signum: int, tmp_path: Path) -> None:
    # No Redis needed: serve starts without it, and /healthz answers all the same.
    env = runner_env("redis://127.0.0.1:1/0")
    with serving(env, tmp_path / "serve.log") as served:
        assert served.get("/healthz")[0] == 200
        served.proc.send_signal(signum)
        code = served.proc.wait(timeout=30)
        assert code == 0, (code, served.log.read_text())
        assert "Traceback" not in served.log.read_text()
