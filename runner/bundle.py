"""The self-contained runner (a PyInstaller bundle with its own C library, bundle/launch.c)
in an image that is not its own: what it sets right for itself and for the commands it starts.

Nothing here runs in a pip install: every function is a no-op unless the runner is frozen.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Where distributions keep their CA bundle, for a bundle whose OpenSSL looks where Debian's does.
_SYSTEM_CA_FILES = (
    "/etc/ssl/certs/ca-certificates.crt",  # Debian, Ubuntu, Alpine (ca-certificates)
    "/etc/pki/tls/certs/ca-bundle.crt",  # RHEL, UBI, Fedora
    "/etc/ssl/ca-bundle.pem",  # SUSE
    "/etc/ssl/cert.pem",  # Alpine (libressl, openssl)
)
_SYSTEM_ZONEINFO = "/usr/share/zoneinfo"


def frozen() -> bool:
    return bool(getattr(sys, "frozen", False))


def _home() -> Path:
    # PyInstaller's directory of the bundle's libraries and data (bundle/_internal).
    return Path(getattr(sys, "_MEIPASS", ""))


def settle() -> None:
    """At start: give the commands the runner starts the environment the app image gave it.

    The bundle's loader put its own library directory, C library included, first in
    LD_LIBRARY_PATH, and PyInstaller added variables of its own. Inherited, they would make
    the app's programs load the bundle's libraries through the image's own loader (a glibc
    mismatch, or another PyInstaller app confused). The loader read LD_LIBRARY_PATH once, at
    start: changing it now changes nothing for the runner itself.
    """
    if not frozen():
        return
    original = os.environ.pop("LD_LIBRARY_PATH_ORIG", None)
    if original is None:
        os.environ.pop("LD_LIBRARY_PATH", None)
    else:
        os.environ["LD_LIBRARY_PATH"] = original
    for name in [n for n in os.environ if n.startswith("_PYI_")]:
        del os.environ[name]
    # An image without a time zone database (scratch, distroless static): the one the bundle
    # carries, after the paths Python knows. Only then: zoneinfo costs 1.5 ms of a start.
    if not Path(_SYSTEM_ZONEINFO).is_dir() and "PYTHONTZPATH" not in os.environ:
        import zoneinfo  # noqa: PLC0415

        zoneinfo.reset_tzpath([*zoneinfo.TZPATH, str(_home() / "share" / "zoneinfo")])


def ca_file() -> str | None:
    """The CA file a TLS connection trusts when the user named none, or None for OpenSSL's own.

    The bundle's OpenSSL looks where Debian keeps its CAs; other images keep theirs elsewhere,
    and scratch has none: then the Mozilla CAs the bundle carries (certifi).
    """
    if not frozen() or "SSL_CERT_FILE" in os.environ or "SSL_CERT_DIR" in os.environ:
        return None
    import ssl  # noqa: PLC0415

    paths = ssl.get_default_verify_paths()
    if (paths.cafile and Path(paths.cafile).is_file()) or (
        paths.capath and Path(paths.capath).is_dir() and any(Path(paths.capath).iterdir())
    ):
        return None
    for path in _SYSTEM_CA_FILES:
        if Path(path).is_file():
            return path
    import certifi  # noqa: PLC0415

    return str(certifi.where())
