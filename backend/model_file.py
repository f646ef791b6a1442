"""GGUF model files: checking a file and reading its header (the one home of GGUF header reading).

gguf's GGUFReader turns every entry of the tokenizer arrays into numpy views: seconds per read on a large
vocabulary (docs/measurements/speed.md#reading-the-gguf-header). So the header is walked here once, arrays
skipped: `read_model_header` reads the metadata only (milliseconds, for the GUI's first frame);
`open_reader` also reads the tensor table into gguf's own ReaderTensor, with gguf's quantization tables,
checking every tensor lies inside the file (`read_model_info`, the K/V writer, the fingerprint). A file
the walk does not take (big-endian) goes to gguf's reader; one version 1 or damaged is refused.
"""
from __future__ import annotations

import functools
import math
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from .embedded_models import assemble_if_embedded
from .errors import ModelFileError
from .sampling import recommended

GGUF_MAGIC = b"GGUF"
MAX_DIMS = 4  # GGML_MAX_DIMS: a tensor has at most four dimensions
MAX_NESTING = 8  # arrays of arrays deeper than this are refused (llama.cpp reads none nested at all)


@dataclass(frozen=True)
class ModelInfo:
    path: str
    architecture: str
    name: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ctx_train: int
    file_type: int | None
    size_bytes: int
    chat_template: str | None
    sliding_window: int = 0  # the window of a sliding-window attention layer (gemma3), in tokens; 0: none
    head_dim: int = 0  # K/V width of one attention head (0: n_embd / n_head)
    sampling: tuple = ()  # the file's recommended sampling (general.sampling.*) as (field, value) pairs

    @property
    def has_sliding_window(self) -> bool:
        """Whether some layers attend within a sliding window (the GGUF's `*.attention.sliding_window`)."""
        return self.sliding_window > 0


def check_gguf(path: str | os.PathLike) -> Path:
    """Cheap checks before llama.cpp sees the file: exists, is a file, starts with the GGUF magic. The
    embedded Gemma's place is the one missing file made here (embedded_models.assemble_if_embedded), since
    every opening of a model passes through this check."""
    p = Path(path)
    if not p.exists():
        assemble_if_embedded(p)
    if not p.exists():
        raise ModelFileError(f"Model file not found: {p}. Check the path, or download the model again.")
    if not p.is_file():
        raise ModelFileError(f"Not a file: {p}. Choose a .gguf model file.")
    with p.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ModelFileError(
            f"{p.name} is not a GGUF model (it does not start with 'GGUF'). Choose a .gguf file."
        )
    return p


def read_model_info(path: str | os.PathLike) -> ModelInfo:
    """Parse the GGUF header and tensor table (open_reader).

    A truncated or corrupt file fails here, with a clear error, instead of inside llama.cpp.
    """
    p = check_gguf(path)
    return _info_from_fields(p, open_reader(p).values)


def read_model_header(path: str | os.PathLike) -> ModelInfo:
    """The ModelInfo of a GGUF file from its metadata alone (milliseconds); raises ModelFileError for a
    missing, non-GGUF or damaged file. The tensor table is not read (the engine checks it when it loads the model)."""
    p = check_gguf(path)
    try:
        with p.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            fields = _metadata(buf)
    except _Unsupported:  # big-endian: gguf's own reader takes it
        return read_model_info(p)
    except Exception as exc:  # the walk's own checks, struct and OS errors: one clear message
        raise _refusal(p, exc) from exc
    return _info_from_fields(p, fields)


def _refusal(p: Path, exc: Exception) -> ModelFileError:
    """The ModelFileError for a file the header walk or gguf's reader could not take."""
    if isinstance(exc, ModelFileError):
        return exc
    if isinstance(exc, _NotReadable):
        return ModelFileError(f"{p.name} {exc}. Or choose another file.")
    return ModelFileError(f"{p.name} is damaged or truncated ({type(exc).__name__}: {exc}). "
                          "Download it again or choose another file.")


def _info_from_fields(p: Path, fields: dict) -> ModelInfo:
    """The ModelInfo of the GGUF file `p` from its metadata key-value pairs."""
    arch = fields.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelFileError(f"{p.name} has no general.architecture; it is not a model llama.cpp can run.")

    def need(key: str) -> int:
        value = fields.get(f"{arch}.{key}")
        if not isinstance(value, (int, float)):
            raise ModelFileError(f"{p.name} lacks {arch}.{key}; the file is incomplete or not a language model.")
        return _count(p, f"{arch}.{key}", value)

    def optional(key: str) -> int:
        value = fields.get(key)
        return _count(p, key, value) if isinstance(value, (int, float)) else 0

    n_head = need("attention.head_count")
    head_kv = fields.get(f"{arch}.attention.head_count_kv")
    n_head_kv = need("attention.head_count_kv") if head_kv is not None else n_head
    file_type, template = fields.get("general.file_type"), fields.get("tokenizer.chat_template")
    # NaN or infinite recommendations are dropped: backend.sampling.recommended takes int() of them
    sampling = {k: v for k, v in fields.items() if k.startswith("general.sampling.") and _finite(v)}
    return ModelInfo(
        path=str(p),
        architecture=arch,
        name=str(fields.get("general.name", p.stem)),
        n_layer=need("block_count"),
        n_embd=need("embedding_length"),
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_ctx_train=need("context_length"),
        file_type=file_type if isinstance(file_type, int) else None,
        size_bytes=p.stat().st_size,
        chat_template=template if isinstance(template, str) else None,
        sliding_window=optional(f"{arch}.attention.sliding_window"),
        head_dim=optional(f"{arch}.attention.key_length"),
        sampling=tuple(sorted(recommended(sampling).items())),
    )


def _finite(value) -> bool:
    return not isinstance(value, float) or math.isfinite(value)


def _count(p: Path, key: str, value: int | float) -> int:
    """A size or count from the metadata as an int; NaN, infinite or negative is a damaged file."""
    if not _finite(value) or value < 0:
        raise ModelFileError(f"{p.name} has {key} = {value}, which is not a size; the file is damaged. "
                             "Download it again or choose another file.")
    return int(value)


def kv_bytes_per_token(info: ModelInfo) -> int:
    """The F16 K/V cache one token takes in every layer (what a context of n tokens costs, times n)."""
    head_dim = info.head_dim or info.n_embd // max(1, info.n_head)
    return info.n_layer * info.n_head_kv * head_dim * 2 * 2


@dataclass
class GGUFContents:
    """A GGUF file as `open_reader` reads it: metadata values (an array as GGUFArray, its length only), the
    bytes of each key-value pair in the file, and the tensor table as gguf's ReaderTensor (data: views of
    the memory-mapped file)."""

    values: dict
    spans: dict[str, tuple[int, int]]
    tensors: list
    data: "np.ndarray"  # the whole file, uint8, memory-mapped


def open_reader(path: Path) -> GGUFContents:
    """The file's metadata and tensor table; any parse failure becomes a ModelFileError. One walk of the
    header (gguf's GGUFReader took 23.7 s on Gemma 3's 262,144-token vocabulary and 5.4 s on SmolLM2's:
    docs/measurements/speed.md#reading-the-gguf-header); a file the walk does not take (big-endian) goes to
    gguf's reader."""
    import numpy as np

    try:
        data = np.memmap(path, mode="r")
        try:
            values, spans, at, n_tensors = _walk(data)
        except _Unsupported:
            return _from_gguf_reader(path)
        tensors = _tensor_table(data, at, n_tensors, _alignment(values))
    except Exception as exc:  # struct, numpy, gguf and the walk raise many kinds on damaged files
        raise _refusal(path, exc) from exc
    return GGUFContents(values, spans, tensors, data)


def _alignment(values: dict) -> int:
    align = values.get("general.alignment", 32)
    if not isinstance(align, int) or align <= 0 or align & (align - 1):
        raise ValueError(f"general.alignment {align!r} is not a power of two")
    return align


def _tensor_table(data, at: int, count: int, alignment: int) -> list:
    """gguf's ReaderTensor for each entry of the tensor table at `at`, as GGUFReader builds them."""
    import numpy as np
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as Q
    from gguf.gguf_reader import ReaderTensor
    from gguf.quants import quant_shape_to_byte_shape

    plain = {Q.F16: np.float16, Q.F32: np.float32, Q.F64: np.float64, Q.I8: np.int8, Q.I16: np.int16,
             Q.I32: np.int32, Q.I64: np.int64}
    infos = []
    if count > (len(data) - at) // 24:  # an entry takes at least 24 bytes (name length, n_dims, type, offset)
        raise ValueError(f"the tensor table claims {count:,} tensors, more than the file can hold")
    for _ in range(count):
        name, at = _string(data, at, errors="strict")
        n_dims = struct.unpack_from("<I", data, at)[0]
        if n_dims > MAX_DIMS:
            raise ValueError(f"tensor {name[:80]} has {n_dims:,} dimensions (at most {MAX_DIMS})")
        dims = np.array(struct.unpack_from(f"<{n_dims}Q", data, at + 4), dtype=np.uint64)
        raw_type, offset = struct.unpack_from("<IQ", data, at + 4 + 8 * n_dims)
        at += 4 + 8 * n_dims + 12
        infos.append((name, dims, Q(raw_type), offset))
    if len({name for name, *_ in infos}) != len(infos):
        raise ValueError("the tensor table names a tensor twice")
    start = -(-at // alignment) * alignment
    tensors = []
    for name, dims, qtype, offset in infos:
        n_elems = math.prod(int(d) for d in dims)  # numpy's uint64 product would wrap round silently
        block_size, type_size = GGML_QUANT_SIZES[qtype]
        n_bytes = n_elems * type_size // block_size
        offs = start + offset
        _check_inside(name, offs, n_bytes, len(data))
        shape = tuple(reversed(dims.tolist()))
        item = plain.get(qtype)
        if item is None:
            item, shape = np.uint8, quant_shape_to_byte_shape(shape, qtype)
        view = data[offs:offs + n_bytes].view(item).reshape(shape)
        tensors.append(ReaderTensor(name=name, tensor_type=qtype, shape=dims, n_elements=n_elems, n_bytes=n_bytes,
                                    data_offset=offs, data=view, field=None))
    return tensors


def _check_inside(name: str, offset: int, n_bytes: int, file_size: int) -> None:
    if offset + n_bytes > file_size:
        raise ValueError(f"tensor {name} runs past the end of the file")


def _from_gguf_reader(path: Path) -> GGUFContents:
    """The same contents through gguf's own reader (slow on large vocabularies, but it reads any byte order)."""
    from gguf import GGUFReader

    reader = GGUFReader(path, "r")
    size = path.stat().st_size
    for t in reader.tensors:
        _check_inside(t.name, t.data_offset, t.n_bytes, size)
    values, spans = {}, {}
    for name, f in reader.fields.items():
        values[name] = GGUFArray(len(f.data)) if f.types and f.types[0].name == "ARRAY" else _field_value(f)
        spans[name] = (f.offset, f.offset + sum(part.nbytes for part in f.parts))
    return GGUFContents(values, spans, reader.tensors, reader.data)


def _field_value(field):
    """A GGUF metadata value as a Python scalar or string (via gguf's own decoder)."""
    try:
        return field.contents()
    except Exception:
        return None


class _Unsupported(Exception):
    """A file the walk leaves to gguf's reader (big-endian)."""


class _NotReadable(ValueError):
    """A well-formed file this app does not read (an old GGUF version)."""


class GGUFArray:
    """An array value; its elements are skipped (nothing read from the header needs them), len() is its count."""

    def __init__(self, count: int = 0):
        self.count = count

    def __len__(self) -> int:
        return self.count


def _metadata(buf) -> dict:
    """The metadata key-value pairs of a little-endian GGUF v2/v3 file, arrays skipped."""
    return _walk(buf)[0]


def _string(buf, at: int, errors: str = "replace", order: str = "<") -> tuple[str, int]:
    """A GGUF string at `at` and where it ends; its length is checked against the file before any copy."""
    n = struct.unpack_from(order + "Q", buf, at)[0]
    if n > len(buf) - at - 8:
        raise ValueError(f"a string at byte {at:,} claims {n:,} bytes, past the end of the file")
    return bytes(buf[at + 8:at + 8 + n]).decode("utf-8", errors=errors), at + 8 + n


def _walk(buf, order: str = "<") -> tuple[dict, dict, int, int]:
    """(values, the byte span of each key-value pair, where the tensor table starts, the tensor count) of
    a GGUF v2/v3 file in byte `order`; arrays are GGUFArray. A damaged file raises ValueError or struct.error;
    a big-endian one is walked (so checked) and then left to gguf's reader (_Unsupported)."""
    from gguf.constants import GGUFValueType as T
    from gguf.gguf_reader import READER_SUPPORTED_VERSIONS

    version = struct.unpack_from(order + "I", buf, 4)[0]
    if version not in READER_SUPPORTED_VERSIONS:
        if order == "<" and struct.unpack(">I", struct.pack("<I", version))[0] in READER_SUPPORTED_VERSIONS:
            _walk(buf, ">")  # the same checks first: gguf's reader loops for ever on an array count past the end
            raise _Unsupported("a big-endian file")
        if version == 1:
            raise _NotReadable("is GGUF version 1, which this app does not read (versions 2 and 3); "
                               "convert the model again with a current llama.cpp")
        if 3 < version < 256:
            raise _NotReadable(f"is GGUF version {version}, newer than this app reads (versions 2 and 3); update the app")
        raise ValueError(f"the header's version field reads {version}")  # not a version: a damaged file
    n_tensors, n_kv = struct.unpack_from(order + "QQ", buf, 8)
    pos, scalars = 24, _scalar_formats()
    if n_kv > (len(buf) - pos) // 12:  # a pair takes at least 12 bytes (key length, value type)
        raise ValueError(f"the header claims {n_kv:,} metadata pairs, more than the file can hold")
    out: dict = {}
    spans: dict[str, tuple[int, int]] = {}
    for _ in range(n_kv):
        begin = pos
        key, pos = _string(buf, pos, order=order)
        vtype = struct.unpack_from(order + "I", buf, pos)[0]
        pos += 4
        if vtype in scalars:
            out[key] = struct.unpack_from(order + scalars[vtype], buf, pos)[0]
        elif vtype == T.STRING:
            out[key], _ = _string(buf, pos, order=order)
        elif vtype == T.ARRAY:
            out[key] = GGUFArray(struct.unpack_from(order + "IQ", buf, pos)[1])
        pos = _skip(buf, vtype, pos, order)
        spans[key] = (begin, pos)
    return out, spans, pos, n_tensors


def _skip(buf, vtype: int, at: int, order: str = "<") -> int:
    """Where the value of type `vtype` at `at` ends. Nested arrays are walked with a stack of the arrays
    still open (a file cannot make this recurse), at most MAX_NESTING deep."""
    from gguf.constants import GGUFValueType as T

    scalars = _scalar_formats()
    open_arrays = [[vtype, 1]]  # [element type, elements left] of each array being walked
    while open_arrays:
        top = open_arrays[-1]
        if top[1] == 0:
            open_arrays.pop()
            continue
        etype = top[0]
        if etype in scalars:  # the rest of this array at once
            at, top[1] = _advance(buf, at, top[1] * struct.calcsize("<" + scalars[etype])), 0
        elif etype == T.STRING:
            n = struct.unpack_from(order + "Q", buf, at)[0]
            at, top[1] = _advance(buf, at, 8 + n), top[1] - 1
        elif etype == T.ARRAY:
            inner, count = struct.unpack_from(order + "IQ", buf, at)
            at, top[1] = _advance(buf, at, 12), top[1] - 1
            if len(open_arrays) > MAX_NESTING:
                raise ValueError(f"arrays nested more than {MAX_NESTING} deep at byte {at:,}")
            if count > (len(buf) - at) // _min_size(inner):
                raise ValueError(f"an array at byte {at:,} claims {count:,} elements, more than the file can hold")
            open_arrays.append([inner, count])
        else:
            raise ValueError(f"unknown value type {etype} at byte {at:,}")
    return at


def _advance(buf, at: int, n: int) -> int:
    if n > len(buf) - at:
        raise ValueError(f"a value at byte {at:,} runs past the end of the file")
    return at + n


def _min_size(vtype: int) -> int:
    """The fewest bytes one value of this type takes (a string: its length; an array: type and count)."""
    from gguf.constants import GGUFValueType as T

    if vtype in _scalar_formats():
        return struct.calcsize("<" + _scalar_formats()[vtype])
    return {T.STRING: 8, T.ARRAY: 12}.get(vtype, 1)


@functools.cache
def _scalar_formats() -> dict:
    """struct codes of the scalar value types, without byte order (gguf is imported only when a file is read)."""
    from gguf.constants import GGUFValueType as T

    return {T.UINT8: "B", T.INT8: "b", T.UINT16: "H", T.INT16: "h", T.UINT32: "I", T.INT32: "i",
            T.FLOAT32: "f", T.BOOL: "?", T.UINT64: "Q", T.INT64: "q", T.FLOAT64: "d"}
