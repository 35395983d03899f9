"""``worker --processes N``: N forked worker processes (runner.queue.worker), supervised
(docs/design.md, Queue mode).

SIGTERM is passed on to every process. One that dies on its own stops the others, so that
the pod restarts visibly rather than running short-handed. Dramatiq's Prometheus metrics,
when asked for, are served once for all of them.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import tempfile
import threading
from collections.abc import Iterable
from typing import Any

from runner.config.queue import QueueSettings
from runner.config.settings import Settings
from runner.errors import ConfigError, CronRunnerError, StoreUnavailable
from runner.queue.worker import Plan, plan, serve
from runner.signals import STOP_SIGNALS, Shutdown
from runner.tasks import Registry

# The worker's own logger: these lines are part of the worker's log contract.
log = logging.getLogger("runner.worker")

# A worker process's exit codes that the pod's exit repeats (runner/errors.py).
_PASSED_ON = (ConfigError.exit_code, StoreUnavailable.exit_code)


def prepare_metrics(port: int) -> Any:
    """Dramatiq's Prometheus middleware metrics on ``port``, for every worker process of this
    pod (prometheus_client's multiprocess mode, in a fresh directory under /tmp). Returns what
    serves them; start it once the workers are forked: a process forked while another of its
    threads runs may inherit a lock that thread held, and hang."""
    db = tempfile.mkdtemp(prefix="cron-runner-dramatiq-prom-")
    # The middleware reads these when its module is first imported, and each process again.
    os.environ.update(dramatiq_prom_db=db, dramatiq_prom_port=str(port),
                      PROMETHEUS_MULTIPROC_DIR=db, prometheus_multiproc_dir=db)  # fmt: skip
    try:
        from dramatiq.middleware import prometheus  # noqa: PLC0415 - only with a metrics port
    except ImportError as exc:  # prometheus_client missing
        raise ConfigError(
            f"CRON_RUNNER_WORKER_METRICS_PORT needs prometheus_client (pip install "
            f"'redis-cron-runner[serve]'): {exc}"
        ) from exc

    def start() -> None:
        thread = threading.Thread(
            target=prometheus._run_exposition_server, name="dramatiq-metrics", daemon=True
        )
        thread.start()
        log.info(f"worker metrics on port {port}", extra={"event": "worker_metrics", "port": port})

    return start


def _child(
    settings: Settings, qs: QueueSettings, served: Plan, worker_id: str
) -> None:  # pragma: no cover - runs in a forked process
    stop = Shutdown().install()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    try:
        code = serve(settings, qs, served, worker_id=worker_id, stop=stop)
    except CronRunnerError as exc:
        # As the CLI edge does for one process: no traceback, and the code says which fault,
        # so that the supervisor can pass a 78 (configuration) or a 69 (Redis unreachable) on.
        log.error(str(exc), extra={"event": "error", "exit_code": exc.exit_code})
        code = exc.exit_code
    except Exception:
        log.exception("worker process failed", extra={"event": "worker_failed"})
        code = 1
    logging.shutdown()
    os._exit(code)


def supervise(settings: Settings, qs: QueueSettings, registry: Registry) -> int:
    """``--processes N``: N forked worker processes. SIGTERM is passed on; if one dies on its
    own, the others are stopped too and the exit is non-zero, so that the pod restarts
    visibly rather than running short-handed: the child's own 78 (configuration) or 69 (Redis
    unreachable) as with one process, else 1."""
    served = plan(registry, qs)
    start_metrics = prepare_metrics(qs.metrics_port) if qs.metrics_port is not None else None
    if qs.processes == 1:
        if start_metrics:
            start_metrics()
        return serve(settings, qs, served, worker_id=settings.lease.holder)
    fork = multiprocessing.get_context("fork")
    stop = Shutdown().install()
    # Signals arriving between fork and a child's own handlers must wait, not kill it.
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    children = [
        fork.Process(
            target=_child,
            args=(settings, qs, served, f"{settings.lease.holder}#{i}"),
            name=f"worker-{i}",
        )
        for i in range(qs.processes)
    ]
    for child in children:
        child.start()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    if start_metrics:
        start_metrics()
    code = 0
    forwarded = False
    while any(c.exitcode is None for c in children):
        if stop.event.is_set() and not forwarded:
            _signal_all(children, signal.SIGTERM)
            forwarded = True
        multiprocessing.connection.wait([c.sentinel for c in children], timeout=0.2)
        for child in children:
            if child.exitcode is not None and not forwarded:
                log.error(
                    f"worker process {child.pid} exited with code {child.exitcode}; stopping "
                    "the others",
                    extra={"event": "worker_failed", "pid": child.pid},
                )
                code = child.exitcode if child.exitcode in _PASSED_ON else 1
                _signal_all(children, signal.SIGTERM)
                forwarded = True
    for child in children:
        code = code or (child.exitcode if child.exitcode and child.exitcode > 0 else 0)
    return code


def _signal_all(children: Iterable[Any], sig: signal.Signals) -> None:
    for child in children:
        if child.exitcode is None and child.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, sig)
