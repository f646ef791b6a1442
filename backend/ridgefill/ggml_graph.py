"""ctypes access to ggml tensors (the nodes the eval callback hands us), and a layout self-check.

llama-cpp-python exposes no struct for `ggml_tensor`, so its layout is declared here for the vendored
ggml (x86-64/aarch64, 64-bit pointers). `check_layout()` builds real tensors with ggml's own functions
and compares every field we rely on; RidgeFill is refused when it does not hold.

Where a tensor lives: a host tensor is read and written through its `data` pointer (numpy views, the fast
path), a tensor in a GPU's memory (CUDA, Metal, Vulkan) through ggml's backend API
(ggml_backend_tensor_get / _set), which an eval callback may call on the node it was just handed.
"""
from __future__ import annotations

import ctypes
import functools
import struct
from pathlib import Path

import numpy as np

GGML_MAX_DIMS = 4
GGML_MAX_OP_PARAMS = 64  # bytes
GGML_MAX_SRC = 10
GGML_MAX_NAME = 64

GGML_TYPE_F32 = 0
GGML_TYPE_F16 = 1
GGML_TYPE_I32 = 26
GGML_TYPE_I64 = 27

# True: every tensor goes through ggml's backend API, host ones too (tests check that path on the CPU build)
FORCE_BACKEND_API = False


class GgmlTensor(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int32),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
        ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
        ("op", ctypes.c_int32),
        ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * GGML_MAX_SRC),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * GGML_MAX_NAME),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


EXPECTED_OFFSETS = {"type": 0, "buffer": 8, "ne": 16, "nb": 48, "op": 80, "op_params": 84, "flags": 148,
                    "src": 152, "view_src": 232, "view_offs": 240, "data": 248, "name": 256, "extra": 320}
EXPECTED_SIZE = 336


class LayoutError(Exception):
    """The ctypes view of ggml_tensor does not match this ggml build."""


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


@functools.lru_cache(maxsize=1)
def lib() -> ctypes.CDLL:
    """libggml-base from llama-cpp-python's own lib folder (the one its llama.cpp was linked with)."""
    import llama_cpp

    folder = Path(llama_cpp.__file__).parent / "lib"
    names = ["libggml-base.so", "libggml-base.dylib", "ggml-base.dll"]
    for name in names:
        if (folder / name).exists():
            dll = ctypes.CDLL(str(folder / name))
            break
    else:
        raise LayoutError(f"libggml-base not found next to llama_cpp ({', '.join(names)})")
    dll.ggml_op_name.restype = ctypes.c_char_p
    dll.ggml_op_name.argtypes = [ctypes.c_int]
    dll.ggml_get_name.restype = ctypes.c_char_p
    dll.ggml_get_name.argtypes = [ctypes.c_void_p]
    dll.ggml_nbytes.restype = ctypes.c_size_t
    dll.ggml_nbytes.argtypes = [ctypes.c_void_p]
    dll.ggml_tensor_overhead.restype = ctypes.c_size_t
    dll.ggml_backend_buffer_is_host.restype = ctypes.c_bool
    dll.ggml_backend_buffer_is_host.argtypes = [ctypes.c_void_p]
    dll.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    dll.ggml_backend_tensor_set.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    dll.ggml_init.restype = ctypes.c_void_p
    dll.ggml_init.argtypes = [_InitParams]
    dll.ggml_free.argtypes = [ctypes.c_void_p]
    dll.ggml_new_tensor_2d.restype = ctypes.c_void_p
    dll.ggml_new_tensor_2d.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    dll.ggml_set_name.restype = ctypes.c_void_p
    dll.ggml_set_name.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    dll.ggml_add.restype = ctypes.c_void_p
    dll.ggml_add.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    dll.ggml_scale.restype = ctypes.c_void_p
    dll.ggml_scale.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_float]
    dll.ggml_view_1d.restype = ctypes.c_void_p
    dll.ggml_view_1d.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_size_t]
    return dll


@functools.lru_cache(maxsize=None)
def op_name(op: int) -> str:
    return lib().ggml_op_name(op).decode()


def view(ptr: int) -> GgmlTensor:
    """A live ctypes view of the tensor at `ptr` (no copy; valid while the graph is)."""
    return GgmlTensor.from_address(ptr)


class Node:
    """A convenient snapshot of one tensor's header."""

    __slots__ = ("ptr", "t")

    def __init__(self, ptr: int):
        self.ptr = int(ptr)
        self.t = view(self.ptr)

    @property
    def name(self) -> str:
        return self.t.name.decode("utf-8", "replace")

    @property
    def op(self) -> str:
        return op_name(self.t.op)

    @property
    def type(self) -> int:
        return self.t.type

    @property
    def ne(self) -> tuple[int, ...]:
        return tuple(self.t.ne)

    @property
    def nb(self) -> tuple[int, ...]:
        return tuple(self.t.nb)

    @property
    def data(self) -> int:
        return self.t.data or 0

    def src(self, i: int) -> "Node | None":
        p = self.t.src[i]
        return Node(p) if p else None

    @property
    def view_src(self) -> "Node | None":
        p = self.t.view_src
        return Node(p) if p else None

    def root(self) -> "Node":
        """Follow view_src to the tensor that owns the memory."""
        n = self
        for _ in range(64):
            v = n.view_src
            if v is None:
                return n
            n = v
        return n

    def op_params_i32(self) -> list[int]:
        return list(self.t.op_params)

    def op_params_f32(self, i: int) -> float:
        return struct.unpack("<f", struct.pack("<i", self.t.op_params[i]))[0]

    def is_host(self) -> bool:
        return bool(self.t.buffer) and bool(lib().ggml_backend_buffer_is_host(self.t.buffer))

    def nbytes(self) -> int:
        return int(lib().ggml_nbytes(self.ptr))

    def through_api(self) -> bool:
        """Whether this tensor is read and written through ggml's backend API (not host memory, or
        FORCE_BACKEND_API: the tests run the GPU path on the CPU build)."""
        return FORCE_BACKEND_API or not self.is_host()

    def _check_span(self, offset: int, nbytes: int) -> None:
        # ggml_backend_tensor_get/_set abort the process on these (GGML_ASSERT): refuse them here instead
        if not self.t.buffer or not self.data:
            raise LayoutError(f"tensor {self.name} has no backend buffer")
        if offset < 0 or offset + nbytes > self.nbytes():
            raise LayoutError(f"{nbytes} bytes at {offset} exceed tensor {self.name} ({self.nbytes()} bytes)")

    def get_into(self, out: np.ndarray, offset: int = 0) -> np.ndarray:
        """Copies `out.nbytes` bytes from `offset` of the tensor into the contiguous array `out`."""
        self._check_span(offset, out.nbytes)
        lib().ggml_backend_tensor_get(self.ptr, out.ctypes.data, offset, out.nbytes)
        return out

    def set_from(self, values: np.ndarray, offset: int = 0) -> None:
        """Copies the contiguous array `values` into the tensor from byte `offset` on."""
        self._check_span(offset, values.nbytes)
        lib().ggml_backend_tensor_set(self.ptr, values.ctypes.data, offset, values.nbytes)

    def array(self, dtype, shape: tuple[int, ...]) -> np.ndarray:
        """A numpy view of a contiguous host tensor's memory (no copy: writes go to the tensor)."""
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        if not self.is_host() or not self.data:
            raise LayoutError(f"tensor {self.name} is not in host memory")
        if nbytes > self.nbytes():
            raise LayoutError(f"view of {nbytes} bytes exceeds tensor {self.name} ({self.nbytes()} bytes)")
        buf = (ctypes.c_char * nbytes).from_address(self.data)
        return np.frombuffer(buf, dtype=dtype).reshape(shape)

    def read(self, dtype, shape: tuple[int, ...]) -> np.ndarray:
        """A copy of a contiguous tensor's first elements, wherever it lives."""
        if self.through_api():
            return self.get_into(np.empty(shape, dtype=dtype))
        return self.array(dtype, shape).copy()

    def write(self, values: np.ndarray) -> None:
        """`values` (C-contiguous) into a contiguous tensor's first elements, wherever it lives."""
        values = np.ascontiguousarray(values)
        if self.through_api():
            self.set_from(values)
        else:
            self.array(values.dtype, values.shape)[...] = values

    def rows_f32(self) -> np.ndarray:
        """A 2-D F32 tensor ne=[n_embd, n_rows] as a copied (n_rows, n_embd) array; strides honoured."""
        if self.type != GGML_TYPE_F32:
            raise LayoutError(f"{self.name} is type {self.type}, expected F32")
        ne0, ne1 = self.t.ne[0], self.t.ne[1]
        nb1 = self.t.nb[1]
        if self.t.nb[0] != 4 or nb1 % 4:
            raise LayoutError(f"{self.name} rows are not contiguous")
        if not self.data:
            raise LayoutError(f"tensor {self.name} has no data")
        span = (ne1 - 1) * nb1 + ne0 * 4
        if self.through_api():  # one copy of the whole span, the rows picked out of it
            flat = self.get_into(np.empty(span // 4, dtype=np.float32))
        else:
            flat = np.frombuffer((ctypes.c_char * span).from_address(self.data), dtype=np.float32)
        a = np.lib.stride_tricks.as_strided(flat, shape=(ne1, ne0), strides=(nb1, 4))
        return np.array(a, dtype=np.float32)


class DeviceRows:
    """A contiguous 2-D tensor (a K/V cache: one row per cell) that is not in host memory, seen as rows:
    indexing copies the rows out (ggml_backend_tensor_get), assigning copies them in (_set), one call per
    run of consecutive rows. What a numpy view of a host cache does, for the callers of CacheTensor.rows()."""

    def __init__(self, node: Node, n_rows: int, row_bytes: int, dtype):
        self.node, self.n_rows, self.row_bytes, self.dtype = node, n_rows, row_bytes, np.dtype(dtype)
        if row_bytes % self.dtype.itemsize:
            raise LayoutError(f"a row of {row_bytes} bytes is not a whole number of {self.dtype}")
        self.shape = (n_rows, row_bytes // self.dtype.itemsize)

    def view(self, dtype) -> "DeviceRows":
        return DeviceRows(self.node, self.n_rows, self.row_bytes, dtype)

    def _runs(self, key) -> tuple[np.ndarray, list[tuple[int, int]]]:
        """The rows `key` picks (as numpy would) and their runs of consecutive rows, (start in key, length)."""
        rows = np.arange(self.n_rows)[key]
        rows = np.atleast_1d(rows)
        if rows.ndim != 1:
            raise IndexError("rows of a device tensor are picked by one index array, slice or integer")
        breaks = np.flatnonzero(np.diff(rows) != 1) + 1
        starts = np.concatenate(([0], breaks)).astype(int)
        ends = np.concatenate((breaks, [len(rows)])).astype(int)
        return rows, [(int(a), int(b - a)) for a, b in zip(starts, ends) if b > a]

    def __getitem__(self, key) -> np.ndarray:
        rows, runs = self._runs(key)
        lo, hi = (int(rows.min()), int(rows.max()) + 1) if len(rows) else (0, 0)
        if len(runs) > 8 and hi - lo <= 4 * len(rows):  # many short runs close together: one copy, gathered
            block = self.node.get_into(np.empty((hi - lo, self.shape[1]), self.dtype), lo * self.row_bytes)
            out = block[rows - lo]
        else:
            out = np.empty((len(rows), self.shape[1]), dtype=self.dtype)
            for at, n in runs:
                self.node.get_into(out[at : at + n], int(rows[at]) * self.row_bytes)
        return out[0] if np.ndim(key) == 0 and not isinstance(key, slice) else out

    def __setitem__(self, key, values) -> None:
        rows, runs = self._runs(key)
        block = np.ascontiguousarray(np.broadcast_to(np.asarray(values, dtype=self.dtype), (len(rows), self.shape[1])))
        for at, n in runs:
            self.node.set_from(block[at : at + n], int(rows[at]) * self.row_bytes)


def _check_offsets() -> None:
    for name, off in EXPECTED_OFFSETS.items():
        got = getattr(GgmlTensor, name).offset
        if got != off:
            raise LayoutError(f"ggml_tensor.{name} at offset {got}, expected {off}")
    if ctypes.sizeof(GgmlTensor) != EXPECTED_SIZE:
        raise LayoutError(f"sizeof(ggml_tensor) = {ctypes.sizeof(GgmlTensor)}, expected {EXPECTED_SIZE}")


@functools.lru_cache(maxsize=1)
def check_layout() -> None:
    """Build tensors with ggml itself and check every field we read. Raises LayoutError."""
    _check_offsets()
    dll = lib()
    overhead = dll.ggml_tensor_overhead()
    if overhead < EXPECTED_SIZE or overhead > EXPECTED_SIZE + 64:
        raise LayoutError(f"ggml_tensor_overhead() = {overhead}, not sizeof(ggml_tensor) {EXPECTED_SIZE} + object")
    ctx = dll.ggml_init(_InitParams(1 << 20, None, False))
    if not ctx:
        raise LayoutError("ggml_init failed")
    try:
        a = dll.ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 7, 3)
        b = dll.ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 7, 3)
        dll.ggml_set_name(a, b"probe-a")
        c = dll.ggml_add(ctx, a, b)
        s = dll.ggml_scale(ctx, a, ctypes.c_float(2.5))
        v = dll.ggml_view_1d(ctx, a, 5, 8)
        na, nc, ns, nv = Node(a), Node(c), Node(s), Node(v)
        problems = []
        if na.name != "probe-a" or dll.ggml_get_name(a) != b"probe-a":
            problems.append("name")
        if na.type != GGML_TYPE_F32 or na.ne != (7, 3, 1, 1) or na.nb[:2] != (4, 28):
            problems.append("type/ne/nb")
        if dll.ggml_nbytes(a) != 84 or not na.data:
            problems.append("data")
        if nc.op != "ADD" or nc.t.src[0] != a or nc.t.src[1] != b:
            problems.append("op/src")
        if ns.op != "SCALE" or abs(ns.op_params_f32(0) - 2.5) > 1e-7:
            problems.append("op_params")
        if nv.t.view_src != a or nv.t.view_offs != 8 or nv.data != na.data + 8:
            problems.append("view_src/view_offs")
        if problems:
            raise LayoutError("ggml_tensor fields do not match this ggml build: " + ", ".join(problems))
    finally:
        dll.ggml_free(ctx)


def layout_problem() -> str | None:
    """None when the layout holds, else a sentence saying why RidgeFill is refused."""
    try:
        check_layout()
    except Exception as exc:  # LayoutError, OSError loading the library, AttributeError on a symbol
        return f"RidgeFill is off: this llama.cpp build's ggml_tensor layout is not the expected one ({exc})."
    return None
