"""Where the hub code talks to (endpoint, token, offline) and where it writes (the user cache).

The folder layout below the cache root is backend/user_paths.py's; a GUI setting or a test moves the root.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from backend import user_paths

DEFAULT_MAPS_OWNER = "ridgefill"


@dataclass
class HubSettings:
    cache_root: Path = field(default_factory=user_paths.cache_dir)  # everything below is derived from it
    endpoint: str | None = None  # None: huggingface_hub's default (HF_ENDPOINT or huggingface.co)
    token: str | None = None  # None: no token is sent (public repos)
    offline: bool = False  # never touch the network; list and use what is cached
    maps_owner: str = DEFAULT_MAPS_OWNER  # the hub user/org whose ridgefill-maps-* repos are looked up
    disk_free: Callable[[Path], int] = field(default=lambda p: shutil.disk_usage(p).free)  # tests shrink it

    def __post_init__(self) -> None:
        self.cache_root = Path(self.cache_root)
        if self.endpoint:
            self.endpoint = self.endpoint.rstrip("/")

    @property
    def models_dir(self) -> Path:
        """Verified models only: models/<model id>/<file>.gguf + installed.json."""
        return self._mk(user_paths.models_dir(self.cache_root))

    @property
    def maps_dir(self) -> Path:
        """Verified map folders, named as backend/ridgefill/map_store.py names them (find_maps looks here)."""
        return self._mk(user_paths.maps_dir(self.cache_root))

    @property
    def staging_dir(self) -> Path:
        """Downloads in progress and awaiting verification; nothing here is ever used as a model."""
        return self._mk(user_paths.staging_dir(self.cache_root))

    @property
    def locks_dir(self) -> Path:
        """One lock file per staging folder (downloads.claim_staging): who is using it right now. Kept
        outside staging so a failed download leaves staging empty; a lock file is never deleted."""
        return self._mk(self.cache_root / "locks")

    @property
    def hf_cache_dir(self) -> Path:
        """huggingface_hub's own cache (reused if a file is already there)."""
        return self._mk(user_paths.hf_cache_dir(self.cache_root))

    @staticmethod
    def _mk(p: Path) -> Path:
        p.mkdir(parents=True, exist_ok=True)
        return p
