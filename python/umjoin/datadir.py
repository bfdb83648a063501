"""Where generated data (TPC-H, TPC-DS, stream files) goes: a user cache directory, never the package.

``$UMJOIN_DATA_DIR`` if set (the CLI's ``--data-dir`` sets it), else ``$XDG_CACHE_HOME/umjoin``,
else ``~/.cache/umjoin``. Read at every call, so a worker process started later sees the same place.
Several processes may share it (two test runs, a test run beside a benchmark): each generation
holds a lock.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["DATA_DIR_ENV", "data_root", "generating"]

DATA_DIR_ENV = "UMJOIN_DATA_DIR"


def data_root() -> Path:
    configured = os.environ.get(DATA_DIR_ENV)
    if configured:
        return Path(configured).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME")
    return (Path(cache) if cache else Path.home() / ".cache") / "umjoin"


@contextmanager
def generating(target: Path) -> Iterator[None]:
    """Holds the lock on generating ``target`` (a file beside it), waiting while another process holds
    it: that process's data is then complete when this one looks, and nothing it reads is rewritten
    under it. The lock goes with the process, so an interrupted generation leaves none behind."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_name(f".{target.name}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
