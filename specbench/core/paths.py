"""Checks that an output path can be written, made before any work starts and leaving nothing behind.

Permission bits are not enough (root ignores them, /proc and read-only mounts do not), so the
check creates and removes an empty temporary directory where the output would go.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from specbench.core.errors import SpecbenchError


def user_cache() -> Path:
    """specbench's directory in the user's cache (XDG_CACHE_HOME, else ~/.cache): what is made once and
    reused by every run (converted models, their drafters, drafters in vLLM's layouts), never a results
    directory."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specbench"


def check_output_dir(path: str | Path, option: str) -> None:
    """`path` is a directory, or can be created as one, that this process can write in."""
    path = Path(path).expanduser()
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        where = "is a file" if existing == path else f"is inside {existing}, which is a file"
        raise SpecbenchError(f"{option} {path} {where}, not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".specbench-probe-", dir=existing))
    except OSError as exc:
        raise SpecbenchError(f"{option} {path}: {existing} does not take new files ({exc.strerror})") from None


def check_output_file(path: str | Path, option: str) -> None:
    """`path` names a file (not a directory) in a directory this process can write in."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise SpecbenchError(f"{option} {path} is a directory; give a file name")
    check_output_dir(path.parent, option)
