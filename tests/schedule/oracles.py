"""The schedule oracles: small Go modules of this repository (oracles/), built at test time from
the Go module proxy with the versions their go.sum pins, into a cache that a second run reuses.

* ``oracles/robfig``: robfig/cron v3.0.1, the CronJob controller's schedule library.
* ``oracles/cronjob``: the CronJob controller itself, ``k8s.io/kubernetes``'s
  ``pkg/controller/cronjob``. Its functions are unexported, so the build vendors the module's
  packages (``go mod vendor``, checked against go.sum) and adds the files under ``_overlay/``
  to them with ``go build -overlay``: small wrappers that export them, and no copy of the
  controller's code. (Go refuses an overlay inside its module cache, hence the vendor tree,
  which lives in the build directory only.)

A binary is cached under ``$CRON_RUNNER_ORACLE_CACHE`` (else ``~/.cache/cron-runner/oracles``)
keyed by a hash of its module's files (go.mod, go.sum, the Go sources) and the Go version.
Go's own module and build caches are the user's, as for any ``go build``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ORACLES = Path(__file__).resolve().parents[2] / "oracles"
#: Where the machines of this project (CI's too) have Go. Debian's golang-go (1.19) is too old
#: for the modules' `go 1.26.0` line; it may still be first on PATH, so it is passed over.
GO_INSTALL = "/usr/local/go/bin/go"
MIN_GO = (1, 26)
OVERLAY = "_overlay"  # a directory name the go command ignores in package patterns


class OracleBuildError(Exception):
    """Go is missing or too old, or the build failed: the message says which and what to do."""


def find_go() -> tuple[str, str]:
    """The first Go 1.26 or later among ``go`` on PATH and /usr/local/go: (path, version)."""
    env = {**os.environ, "GOTOOLCHAIN": "local"}
    env.pop("GOROOT", None)
    seen: list[str] = []
    for candidate in dict.fromkeys(filter(None, (shutil.which("go"), GO_INSTALL))):
        if not os.access(candidate, os.X_OK):
            continue
        asked = subprocess.run(
            [candidate, "env", "GOVERSION"], env=env, capture_output=True, text=True, timeout=60
        )
        version = asked.stdout.strip()
        found = re.match(r"go(\d+)\.(\d+)", version)
        if found and (int(found[1]), int(found[2])) >= MIN_GO:
            return candidate, version
        seen.append(f"{candidate} ({version or 'no version'})")
    raise OracleBuildError(
        f"the schedule oracles need Go {'.'.join(map(str, MIN_GO))} or later, found "
        f"{', '.join(seen) or 'none'}: install Go at /usr/local/go (or first on PATH)"
    )


def cache_dir() -> Path:
    explicit = os.environ.get("CRON_RUNNER_ORACLE_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cron-runner" / "oracles"


def source_key(module: Path, go_version: str) -> str:
    digest = hashlib.sha256(go_version.encode())
    for path in sorted(p for p in module.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(module)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One build of an oracle at a time, across processes (two pytest runs, say)."""
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _go(go: str, args: list[str], cwd: Path) -> None:
    env = {
        **os.environ,
        "GOTOOLCHAIN": "local",  # never a toolchain download: the Go found is the Go used
        "GOWORK": "off",
        "CGO_ENABLED": "0",
        "PATH": f"{Path(go).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    env.pop("GOROOT", None)
    done = subprocess.run([go, *args], cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise OracleBuildError(
            f"`go {' '.join(args)}` in {cwd} failed ({done.returncode}):\n{done.stderr[-4000:]}"
        )


def _build(go: str, module: Path, work: Path, binary: Path) -> None:
    src = work / "src"
    shutil.copytree(module, src)
    args = ["build", "-trimpath", "-o", str(binary)]
    overlay = src / OVERLAY
    if overlay.is_dir():
        # _overlay/<import path>/<file> is added to vendor/<import path>/.
        _go(go, ["mod", "vendor"], src)
        replace = {
            str(src / "vendor" / f.relative_to(overlay)): str(f) for f in overlay.rglob("*.go")
        }
        (work / "overlay.json").write_text(json.dumps({"Replace": replace}))
        args += ["-mod=vendor", f"-overlay={work / 'overlay.json'}"]
    else:
        args += ["-mod=readonly"]
    _go(go, [*args, "."], src)


def oracle(name: str) -> tuple[Path, str]:
    """The binary of oracles/<name>, built unless cached, and how it was had (for the figures):
    'built in N s with goX' or 'cached'."""
    go, version = find_go()
    module = ORACLES / name
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / f"{name}-{source_key(module, version)}" / "oracle"
    with _locked(cache / f"{name}.lock"):
        if target.is_file():
            return target, f"cached ({target.parent})"
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"{name}-build-", dir=cache) as work:
            binary = Path(work) / "oracle"
            _build(go, module, Path(work), binary)
            target.parent.mkdir(exist_ok=True)
            os.replace(binary, target)
        for old in cache.glob(f"{name}-*"):  # earlier sources' binaries
            if old.is_dir() and old != target.parent and not old.name.startswith(f"{name}-build-"):
                shutil.rmtree(old, ignore_errors=True)
        return target, f"built in {time.monotonic() - started:.0f} s with {version} ({go})"
