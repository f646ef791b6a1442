"""Where RidgeFill keeps user files (platformdirs): the one definition, for the backend and the app.

Each folder can be moved by an environment variable (RIDGEFILL_DATA_DIR, RIDGEFILL_CACHE_DIR,
RIDGEFILL_LOG_DIR, RIDGEFILL_CONFIG_DIR); RIDGEFILL_HOME moves them all under one folder (tests,
portable installs), each keeping the last part of its platform name. The app moves the cache of its own
process with `use_cache_root` (the GUI's cache location setting), which wins over the variables. The roots are created on first
use; the folders below the cache root are created by whoever writes them.

The user cache holds:
  models/       verified models (backend/hub/store.py)
  maps/         verified map folders, downloaded or fitted here (found by backend/ridgefill/map_store.py)
  activations/  captured calibration activations, one folder per model variant
  downloads/    hub downloads in progress or awaiting verification
  prompts/      the prompt cache: sequence 0's state after a prefill (backend/prompt_cache.py)
  hf-hub/       huggingface_hub's own cache
"""
from __future__ import annotations

import os
from pathlib import Path

from platformdirs import PlatformDirs

from .private_files import private_dir

APP_NAME = "RidgeFill"
_DIRS = PlatformDirs(APP_NAME, APP_NAME)
_cache_root: Path | None = None  # use_cache_root's; None: the variables and the platform decide


def _dir(env: str, default: str) -> Path:
    home = os.environ.get("RIDGEFILL_HOME")
    p = Path(os.environ.get(env) or (Path(home) / Path(default).name if home else default))
    return private_dir(p)


def data_dir() -> Path:
    return _dir("RIDGEFILL_DATA_DIR", _DIRS.user_data_dir)


def use_cache_root(root: str | Path | None) -> None:
    """The user cache of this process from now on; None gives it back to the variables and the platform."""
    global _cache_root
    _cache_root = Path(root) if root else None


def cache_dir() -> Path:
    if _cache_root is not None:
        return private_dir(_cache_root)
    return _dir("RIDGEFILL_CACHE_DIR", _DIRS.user_cache_dir)


def log_dir() -> Path:
    return _dir("RIDGEFILL_LOG_DIR", _DIRS.user_log_dir)


def config_dir() -> Path:
    return _dir("RIDGEFILL_CONFIG_DIR", _DIRS.user_config_dir)


def models_dir(cache_root: Path | None = None) -> Path:
    return (cache_root or cache_dir()) / "models"


def maps_dir(cache_root: Path | None = None) -> Path:
    return (cache_root or cache_dir()) / "maps"


def activations_dir(cache_root: Path | None = None) -> Path:
    return (cache_root or cache_dir()) / "activations"


def staging_dir(cache_root: Path | None = None) -> Path:
    return (cache_root or cache_dir()) / "downloads"


def hf_cache_dir(cache_root: Path | None = None) -> Path:
    return (cache_root or cache_dir()) / "hf-hub"


def prompts_dir(cache_root: Path | None = None) -> Path:
    return (cache_root or cache_dir()) / "prompts"
