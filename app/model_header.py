"""A model's facts from its GGUF metadata alone, in milliseconds: what the GUI needs before the engine
has loaded (the layer count for the split slider, the model's default split and tail).

`backend.model_file.read_model_info` builds the `gguf` package's full reader, which turns every entry
of the tokenizer arrays into numpy views: too slow for the first frame
(docs/MEASUREMENTS.md#reading-the-gguf-header). This walks the metadata key-value section
once, skipping arrays, and returns the same `ModelInfo`. Anything it does not understand (a big-endian
or version-1 file, an array where a number belongs) falls back to read_model_info, which also checks
the tensor table; the engine runs that check anyway when it loads the model.
"""
from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

from backend.errors import ModelFileError
from backend.model_file import ModelInfo, check_gguf, info_from_fields, read_model_info

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class _Unsupported(Exception):
    pass


class _Array:
    """An array value, skipped (nothing the header read needs is an array)."""


def _metadata(buf) -> dict:
    version = struct.unpack_from("<I", buf, 4)[0]
    if version not in (2, 3):  # 1 is obsolete; a huge number is a big-endian file
        raise _Unsupported(f"GGUF version {version}")
    n_kv = struct.unpack_from("<Q", buf, 16)[0]
    pos = 24

    def string(at: int) -> tuple[str, int]:
        n = struct.unpack_from("<Q", buf, at)[0]
        return bytes(buf[at + 8:at + 8 + n]).decode("utf-8", errors="replace"), at + 8 + n

    def skip(vtype: int, at: int) -> int:
        if vtype in _SCALARS:
            return at + struct.calcsize(_SCALARS[vtype])
        if vtype == _STRING:
            return at + 8 + struct.unpack_from("<Q", buf, at)[0]
        if vtype == _ARRAY:
            etype, count = struct.unpack_from("<IQ", buf, at)
            at += 12
            if etype in _SCALARS:
                return at + count * struct.calcsize(_SCALARS[etype])
            for _ in range(count):
                at = skip(etype, at)
            return at
        raise _Unsupported(f"value type {vtype}")

    out: dict = {}
    for _ in range(n_kv):
        key, pos = string(pos)
        vtype = struct.unpack_from("<I", buf, pos)[0]
        pos += 4
        if vtype in _SCALARS:
            out[key] = struct.unpack_from(_SCALARS[vtype], buf, pos)[0]
        elif vtype == _STRING:
            out[key], _ = string(pos)
        elif vtype == _ARRAY:
            out[key] = _Array()
        pos = skip(vtype, pos)
    return out


def read_model_header(path: str | os.PathLike) -> ModelInfo:
    """The ModelInfo of a GGUF file from its metadata; raises ModelFileError for a missing or non-GGUF file."""
    p = check_gguf(path)
    try:
        with p.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            fields = _metadata(buf)
        return info_from_fields(p, fields)
    except (_Unsupported, ModelFileError, struct.error, ValueError, OSError):  # odd or damaged: the full reader says why
        return read_model_info(p)
