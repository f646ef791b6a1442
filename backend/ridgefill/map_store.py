"""Where map folders live and how they are named.

Search order: the user cache's `maps/` (fitted here or downloaded; a refit wins), then the
`maps_cache/` folder shipped with the app. The user cache is backend/user_paths.py's.
"""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from backend.user_paths import activations_dir  # noqa: F401  (calibration reads it here)
from backend.user_paths import maps_dir as user_maps_dir  # maps fitted or downloaded by this user

from .fingerprint import identity_key


def shipped_maps_dir() -> Path:
    """The `maps_cache/` folder that ships with the app (found without importing it)."""
    spec = importlib.util.find_spec("maps_cache")
    if spec is not None and spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    return Path(__file__).resolve().parents[2] / "maps_cache"


def default_map_dirs() -> list[Path]:
    return [user_maps_dir(), shipped_maps_dir()]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", (text or "model").lower()).strip("-")[:40] or "model"


def map_folder_name(fingerprint: dict, split: int) -> str:
    """`<model name>-<quant>-<identity hash>-s<split>`, e.g. `smollm2-135m-...-q4_1-3b35004e4565-s18`."""
    quant = _quant_label(fingerprint.get("file_type"))
    return f"{_slug(fingerprint.get('name'))}-{quant}-{identity_key(fingerprint)}-s{split:02d}"


def _quant_label(file_type) -> str:
    try:
        from gguf import LlamaFileType

        return LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_").lower()
    except Exception:
        return "ft" + str(file_type)
