"""A run-mode task whose name is valid for a task but not for a queue (it starts with a
digit): registered next to queue-mode tasks, it must not keep a worker from starting."""

from __future__ import annotations

from runner import RunContext, task


@task("1-backup")
def backup(ctx: RunContext) -> None:
    ctx.logger.info("backed up")
