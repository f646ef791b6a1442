"""The split chosen by measurement for one model (`python -m app tune`), kept beside the maps.

`<user cache>/maps/tuned/<model>-<key>.json`: the model, the chosen split, tail and mode, the rule that
chose it and the figures of every candidate measured. The key hashes what the GGUF header says (name,
architecture, layers, width, heads, file type) and the file's size, so it is found without hashing the
file or parsing its tensors, and a record never applies to another model or another quantisation.
backend/ridgefill/defaults.py reads it: a tuned split is the model's default split.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
from pathlib import Path

from backend.json_file import finite
from backend.private_files import private_dir, write_text_private
from backend.user_paths import maps_dir

TUNED_DIR = "tuned"
# a record whose mode is "off": its settings departed from exact's replies, or kept them and gained nothing
EXACT_SUMMARY = "exact (no RidgeFill setting both kept this model's replies and ran faster)"
RECORD_VERSION = 2  # 2: chosen by fidelity (a record of 1, chosen by needles, counts as untuned)


def model_key(info) -> str | None:
    """A short key for this model file from its header facts; None for an info that lacks them."""
    try:
        facts = [info.architecture, info.name, int(info.n_layer), int(info.n_embd), int(info.n_head),
                 int(info.n_head_kv), info.file_type, int(info.size_bytes)]
    except (AttributeError, TypeError, ValueError):
        return None
    return hashlib.sha256(json.dumps(facts).encode()).hexdigest()[:12]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", (text or "model").lower()).strip("-")[:40] or "model"


def tuned_path(info, root: Path | None = None) -> Path | None:
    key = model_key(info)
    if key is None:
        return None
    return (root or maps_dir()) / TUNED_DIR / f"{_slug(info.name)}-{key}.json"


def read_tuned(info, root: Path | None = None) -> dict | None:
    """The tuned record of this model, or None (never tuned, another model, or a damaged file)."""
    path = tuned_path(info, root)
    if path is None or not path.is_file():
        return None
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # RecursionError: JSON nested too deep
        return None
    ok = (isinstance(rec, dict) and rec.get("record_version") == RECORD_VERSION
          and rec.get("model_key") == model_key(info)
          and type(rec.get("split")) is int and 1 <= rec["split"] <= int(info.n_layer) - 2)
    return rec if ok else None


def write_tuned(info, record: dict, root: Path | None = None) -> Path:
    """Write the record atomically (a reader sees the old one or the new one, never half)."""
    path = tuned_path(info, root)
    if path is None:
        raise ValueError("this model's header does not say enough to key a tuned record")
    private_dir(path.parent)
    rec = {"record_version": RECORD_VERSION, "model_key": model_key(info), **record}
    tmp = path.with_name(f".{path.name}.tmp")
    write_text_private(tmp, json.dumps(finite(rec), indent=1, allow_nan=False) + "\n")
    os.replace(tmp, path)
    return path


def summary(rec: dict | None) -> str:
    """One line for the RidgeFill panel: "speed at S = 11, worst of 7 documents valgrind-faq.txt at 1.2×
    q8_0's distance from exact's replies, 1.8× exact's speed"; the split alone where the record's figures
    are not of their shape."""
    if not rec:
        return ""
    try:
        return _summary(rec)
    except (ArithmeticError, AttributeError, KeyError, TypeError, ValueError):  # a hand-edited or damaged record
        return f"S = {rec['split']}: {rec.get('chosen_by') or 'tuned'}"


def _summary(rec: dict) -> str:
    if rec["mode"] == "off":
        return EXACT_SUMMARY
    chosen = next((c for c in rec["candidates"] if c["setting"] == f"{rec['mode']}:{rec['split']}"), None)
    if chosen is None:
        raise KeyError("the chosen setting is not among the candidates")  # the fallback line says the split
    worst = max(chosen["documents"], key=lambda d: math.inf if d["ratio"] is None else d["ratio"])
    at = "beyond q8_0's (which moved nothing there)" if worst["ratio"] is None else f"at {worst['ratio']:.1f}× q8_0's"
    return (f"{rec['mode']} at S = {rec['split']}, worst of {len(chosen['documents'])} documents "
            f"{worst['document']} {at} distance from exact's replies, "
            f"{chosen['ratio']:.2f}× exact's speed")
