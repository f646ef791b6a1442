"""Where the app keeps user files (platformdirs): data, cache (models, maps, activations), logs."""
from __future__ import annotations

import os
from pathlib import Path

from platformdirs import PlatformDirs

_DIRS = PlatformDirs("RidgeFill", "RidgeFill")


def _dir(env: str, default: str) -> Path:
    # RIDGEFILL_HOME moves everything under one folder (tests, portable installs).
    home = os.environ.get("RIDGEFILL_HOME")
    p = Path(os.environ.get(env) or (Path(home) / Path(default).name if home else default))
    p.mkdir(parents=True, exist_ok=True)
    return p


def data_dir() -> Path:
    return _dir("RIDGEFILL_DATA_DIR", _DIRS.user_data_dir)


def cache_dir() -> Path:
    return _dir("RIDGEFILL_CACHE_DIR", _DIRS.user_cache_dir)


def log_dir() -> Path:
    return _dir("RIDGEFILL_LOG_DIR", _DIRS.user_log_dir)


def config_dir() -> Path:
    return _dir("RIDGEFILL_CONFIG_DIR", _DIRS.user_config_dir)
