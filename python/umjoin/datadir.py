"""Where generated data (TPC-H, TPC-DS, stream files) goes: a user cache directory, never the package.

``$UMJOIN_DATA_DIR`` if set (the CLI's ``--data-dir`` sets it), else ``$XDG_CACHE_HOME/umjoin``,
else ``~/.cache/umjoin``. Read at every call, so a worker process started later sees the same place.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["DATA_DIR_ENV", "data_root"]

DATA_DIR_ENV = "UMJOIN_DATA_DIR"


def data_root() -> Path:
    configured = os.environ.get(DATA_DIR_ENV)
    if configured:
        return Path(configured).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME")
    return (Path(cache) if cache else Path.home() / ".cache") / "umjoin"
