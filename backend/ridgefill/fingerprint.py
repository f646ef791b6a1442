"""The model fingerprint: what a map folder must match to be used with a GGUF model.

Two classes of facts (see docs/RIDGEFILL.md, "Matching a folder to a model"):
- identity (a mismatch refuses): architecture, the named metadata values, the tokenizer hash;
- variant (a mismatch warns): the model name, the file type, the encodings (ggml types) and bytes
  of the late layers' K/V-path weights, i.e. another quantisation or fine-tune of the same model.
Everything is read from the GGUF header and tensor table with the `gguf` package; no llama.cpp.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from backend.model_file import GGUFArray, check_gguf, open_reader

# `<arch>.<key>` values that must be equal for a map to fit: shapes and what shapes the stream.
METADATA_KEYS = (
    "block_count",
    "context_length",
    "embedding_length",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "attention.sliding_window",
    "rope.dimension_count",
    "vocab_size",
)
# Per-layer tensors on the K/V write path of a late layer (gemma3's attn_k_norm starts with attn_k).
KV_PATH_PREFIXES = ("attn_norm", "attn_k", "attn_v", "attn_qkv")
_BLK = re.compile(r"^blk\.(\d+)\.([^.]+)\.")

_cache: dict[tuple, dict] = {}


def model_fingerprint(model_path: str | os.PathLike, layers: list[int] | None = None) -> dict:
    """The fingerprint of a GGUF model. `layers`: whose K/V-path weights to describe (default all).

    The file is read once per (path, size, mtime): hashing the K/V weights takes a fraction of a second.
    """
    p = check_gguf(model_path)
    st = p.stat()
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _cache:
        _cache[key] = _read(p)
    base = _cache[key]
    wanted = set(layers) if layers is not None else None
    encodings: dict[str, str] = {}
    weights = hashlib.sha256()
    for name, (layer, encoding, digest) in sorted(base["tensors"].items()):
        if wanted is None or layer in wanted:
            encodings[name] = encoding
            weights.update(f"{name}:{digest};".encode())
    fp = {k: v for k, v in base.items() if k != "tensors"}
    fp["kv_encodings"] = encodings
    fp["kv_weights_sha256"] = weights.hexdigest()
    return json.loads(json.dumps(fp))  # a copy the caller may change


def _read(p: Path) -> dict:
    gguf = open_reader(p)
    values = gguf.values

    def value(name: str):
        v = values.get(name)
        return None if isinstance(v, GGUFArray) else v  # an array's elements are not read

    arch = value("general.architecture")
    metadata = {k: value(f"{arch}.{k}") for k in METADATA_KEYS}
    if metadata["vocab_size"] is None and "tokenizer.ggml.tokens" in values:  # most files leave it out
        metadata["vocab_size"] = len(values["tokenizer.ggml.tokens"])

    tok = hashlib.sha256()
    for name in sorted(n for n in values if n.startswith("tokenizer.ggml.")):
        begin, end = gguf.spans[name]  # the key, its type tags and its values, back to back in the file
        tok.update(gguf.data[begin:end].tobytes())

    tensors: dict[str, tuple[int, str, str]] = {}
    for t in gguf.tensors:
        m = _BLK.match(t.name)
        if m and m.group(2).startswith(KV_PATH_PREFIXES):
            tensors[t.name] = (int(m.group(1)), t.tensor_type.name, hashlib.sha256(t.data.tobytes()).hexdigest())

    return {
        "architecture": arch,
        "name": value("general.name"),
        "file_type": value("general.file_type"),
        "metadata": metadata,
        "tokenizer_sha256": tok.hexdigest(),
        "tensors": tensors,
    }


def identity_key(fp: dict) -> str:
    """A short hash of the identity facts (a mismatch of any of them refuses)."""
    ident = {k: fp.get(k) for k in ("architecture", "metadata", "tokenizer_sha256")}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:12]


def variant_key(fp: dict) -> str:
    """A short hash of everything in the fingerprint (identity and variant)."""
    return hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:12]


def compare(expected: dict, actual: dict) -> tuple[list[str], list[str]]:
    """(refusals, warnings) for maps fitted on `expected` used with a model whose fingerprint is `actual`.

    `actual` should describe (at least) the layers `expected` describes.
    """
    refuse: list[str] = []
    warn: list[str] = []
    if expected.get("architecture") != actual.get("architecture"):
        refuse.append(
            f"the maps are for architecture '{expected.get('architecture')}', the model is "
            f"'{actual.get('architecture')}'"
        )
        return refuse, warn  # nothing else is comparable
    em, am = expected.get("metadata") or {}, actual.get("metadata") or {}
    for k in sorted(set(em) | set(am)):
        if em.get(k) != am.get(k):
            refuse.append(f"metadata {k} differs (maps: {em.get(k)}, model: {am.get(k)})")
    if expected.get("tokenizer_sha256") != actual.get("tokenizer_sha256"):
        refuse.append("the model's tokenizer differs from the one the maps were fitted with")
    if refuse:
        return refuse, warn

    if expected.get("name") != actual.get("name"):
        warn.append(f"fitted on '{expected.get('name')}', this model is named '{actual.get('name')}'")
    ee, ae = expected.get("kv_encodings") or {}, actual.get("kv_encodings") or {}
    differing = [n for n in ee if ae.get(n) != ee[n]]
    if differing or expected.get("file_type") != actual.get("file_type"):
        sample = ", ".join(f"{n} {ee[n]}->{ae.get(n)}" for n in differing[:3])
        warn.append(
            "fitted on another quantisation of this model"
            + (f" ({sample}{', ...' if len(differing) > 3 else ''})" if sample else "")
        )
    elif expected.get("kv_weights_sha256") != actual.get("kv_weights_sha256"):
        warn.append("fitted on other weights of the same shape and encoding (another fine-tune?)")
    return refuse, warn
