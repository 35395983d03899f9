"""Queue mode: Dramatiq producers, workers and their bookkeeping (docs/design.md, Module map).

``from runner.queue import Producer`` is the documented way to send (docs/queue.md); it
resolves on first use, so importing any module of this package costs nothing more.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "Producer":
        from runner.queue.producer import Producer  # noqa: PLC0415 - on first use only

        return Producer
    raise AttributeError(f"module 'runner.queue' has no attribute {name!r}")
