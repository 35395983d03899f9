"""What the start-up benchmarks share (cold_start.py, binary_start.py, telemetry_start.py):
a timed run of a command, each a fresh process, and the commands' runs taken in turns.

The order rotates from round to round, so that drift (the page cache, CPU frequency, a noisy
neighbour) hits every command alike. The standard library only: binary_start.py runs it with
the image's own Python (bench/README.md).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence


def timed_run(command: list[str], env: dict[str, str]) -> float:
    """Seconds from start to exit; a run that fails raises RuntimeError with its stderr."""
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, check=False)
    elapsed_s = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} exited {done.returncode}:\n"
            f"{done.stderr.decode(errors='replace')[-2000:]}"
        )
    return elapsed_s


def in_turns(
    labels: Sequence[str], runs: int, run: Callable[[str], float]
) -> dict[str, list[float]]:
    """``runs`` samples of ``run(label)`` for each label, the labels taking turns."""
    samples: dict[str, list[float]] = {label: [] for label in labels}
    for run_no in range(runs):
        shift = run_no % len(labels)
        for label in [*labels[shift:], *labels[:shift]]:
            samples[label].append(run(label))
    return samples
