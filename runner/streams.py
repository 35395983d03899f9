"""The standard streams of the runner's process, made safe before anything else opens a file
(docs/reliability.md, Standard streams).

A runner may start with fd 0, 1 or 2 closed (``2>&-``, a daemon manager), or with one that is a
pipe whose reader is gone, or ``/dev/full``. None of that may stop a run:

- A closed standard descriptor is taken by the next file or socket opened: the Redis
  connection would become fd 2, and log lines would go into it. Each one closed is reopened on
  ``/dev/null`` first, and Python's ``sys.stdin``/``stdout``/``stderr``, left as None for it,
  are bound again.
- A write that fails (EPIPE, ENOSPC, EIO) is dropped: the log lines and what a Python task
  prints are lost, never the run. Python would otherwise raise in the middle of a run, and at
  exit turn the run's exit code into 120 when the last flush fails. The first failure of stdout
  is kept, for the commands whose output is their result (``output_error``).

What a command started by ``exec`` inherits is its own business: it gets the same
descriptors, ``/dev/null`` in place of a closed one.
"""

from __future__ import annotations

import io
import os
import sys
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

STANDARD_FDS = (0, 1, 2)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def reopen_closed() -> None:
    """Each closed descriptor 0, 1 or 2 onto /dev/null, lowest first."""
    for fd in STANDARD_FDS:
        if _is_open(fd):
            continue
        null = os.open(os.devnull, os.O_RDWR)  # the lowest free descriptor: this one
        if null != fd:
            os.dup2(null, fd)
            os.close(null)


class DroppingWriter(io.RawIOBase):
    """A standard descriptor whose failed writes are dropped, the first failure kept."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self.fd = fd
        self.error: OSError | None = None

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd

    def isatty(self) -> bool:
        return os.isatty(self.fd)

    def write(self, data: ReadableBuffer) -> int:
        view = memoryview(data).cast("B")
        if self.error is None:
            try:
                done = 0
                while done < len(view):
                    done += os.write(self.fd, view[done:])
            except OSError as exc:
                self.error = exc
        return len(view)


def _text_writer(fd: int, old: TextIO | None, *, errors: str) -> TextIO:
    raw = DroppingWriter(fd)
    return io.TextIOWrapper(
        io.BufferedWriter(raw),
        encoding=old.encoding if old is not None else None,
        errors=old.errors if old is not None else errors,
        # As Python sets them: a terminal gets each line at once; stderr always does.
        line_buffering=fd == 2 or raw.isatty(),
    )


def guard() -> None:
    """Called first by the CLI's entry point, before any file or socket is opened."""
    reopen_closed()
    if sys.stdin is None:
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's, never closed
    sys.stdout = _text_writer(1, sys.stdout, errors="strict")
    sys.stderr = _text_writer(2, sys.stderr, errors="backslashreplace")


def output_error() -> OSError | None:
    """The first write to stdout that failed since ``guard``, after a flush of what is left."""
    stdout = sys.stdout
    stdout.flush()
    raw = getattr(getattr(stdout, "buffer", None), "raw", None)
    return raw.error if isinstance(raw, DroppingWriter) else None
