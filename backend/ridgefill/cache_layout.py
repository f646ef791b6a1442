"""Where llama.cpp keeps each layer's KV cache and how it ropes K, found from the graph itself.

A discovery decode of one token (after what is cached, removed after) lets the eval hook see every node
without wanting any: each layer's K/V write is a SET_ROWS node whose destination's view chain leads to
`cache_k_l{il}` / `cache_v_l{il}`, whose `src[1]` is the ubatch's cell index tensor (one per cache:
gemma3's iSWA has two), and whose K value comes (through views) from the layer's ROPE node.
"""
from __future__ import annotations

import ctypes
import re
import struct
from dataclasses import dataclass, field

import numpy as np

from ..errors import RidgeFillError
from . import ggml_graph
from .ggml_graph import GGML_TYPE_F16, GGML_TYPE_I64, DeviceRows, Node

_CACHE_RE = re.compile(r"^cache_([kv])_l(\d+)$")


class LayoutRefused(RidgeFillError):
    """The graph or the KV cache is not what the RidgeFill write path expects; run exact."""


@dataclass(frozen=True)
class RopeParams:
    n_dims: int
    mode: int
    n_ctx_orig: int
    freq_base: float
    freq_scale: float
    ext_factor: float
    attn_factor: float
    beta_fast: float
    beta_slow: float
    freq_factors: tuple[float, ...] | None = None

    @property
    def neox(self) -> bool:
        return bool(self.mode & 2)


@dataclass
class CacheTensor:
    name: str
    ptr: int
    n_embd_gqa: int
    kv_size: int

    def rows(self) -> np.ndarray | DeviceRows:
        """(kv_size, n_embd_gqa) float16 rows of the live cache (writes go to llama.cpp): a numpy view of
        host memory, or DeviceRows (copies through ggml's backend API) for a cache on a GPU."""
        node = Node(self.ptr)
        if node.through_api():
            return DeviceRows(node, self.kv_size, self.n_embd_gqa * 2, np.float16)
        return node.array(np.float16, (self.kv_size, self.n_embd_gqa))


@dataclass
class LayerLayout:
    il: int
    k_cache: CacheTensor
    v_cache: CacheTensor
    k_index: str  # which cell-index input this layer's K write uses: "idx0", "idx1", ... (one per cache;
    v_index: str  # gemma3's two caches give two, and their tensors may share a name, so grouped by pointer)
    rope: RopeParams
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int


@dataclass
class GraphLayout:
    layers: dict[int, LayerLayout] = field(default_factory=dict)
    set_rows_op: int = -1  # this build's enum value of GGML_OP_SET_ROWS

    def cache_index(self) -> dict[str, str]:
        """cache tensor name -> its cell-index group, for reading indices during a bulk ubatch."""
        out = {}
        for ll in self.layers.values():
            out[ll.k_cache.name] = ll.k_index
            out[ll.v_cache.name] = ll.v_index
        return out


def _f32(i: int) -> float:
    return struct.unpack("<f", struct.pack("<i", i))[0]


def _rope_params(node: Node) -> RopeParams:
    p = node.op_params_i32()
    ff = None
    src2 = node.src(2)
    if src2 is not None and src2.type == ggml_graph.GGML_TYPE_F32:  # freq factors (llama3-style rope)
        n = src2.ne[0]
        buf = (ctypes.c_float * n)()
        ggml_graph.lib().ggml_backend_tensor_get(src2.ptr, buf, 0, n * 4)
        ff = tuple(float(x) for x in buf)
    return RopeParams(n_dims=p[1], mode=p[2], n_ctx_orig=p[4], freq_base=_f32(p[5]), freq_scale=_f32(p[6]),
                      ext_factor=_f32(p[7]), attn_factor=_f32(p[8]), beta_fast=_f32(p[9]), beta_slow=_f32(p[10]),
                      freq_factors=ff)


def _root_op(node: Node) -> Node:
    """Skip views/reshapes/permutes/copies back to the node that computed the values."""
    n = node
    for _ in range(16):
        if n.op in ("VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE", "CONT", "CPY"):
            s = n.src(0)
            if s is None:
                break
            n = s
        else:
            break
    return n


class _Collector:
    def __init__(self):
        self.writes: list[tuple[str, int, str, Node, Node]] = []  # (k|v, il, index name, value, root)
        self.error: str | None = None
        self.set_rows_op = -1

    def wants(self, tensor: int) -> bool:
        try:
            n = Node(tensor)
            if n.op == "SET_ROWS":
                dst = n.src(2).root() if n.src(2) else n.root()
                m = _CACHE_RE.match(dst.name)
                if m:
                    self.set_rows_op = n.t.op
                    self.writes.append((m.group(1), int(m.group(2)), n.src(1).ptr, n.src(0), dst))
        except Exception as exc:  # never raise into C
            self.error = str(exc)
        return False

    def seen(self, tensor: int) -> bool:  # pragma: no cover - nothing is wanted
        return True


def discover(engine) -> GraphLayout:
    """Decode one token after the cached ones with a watching hook, then remove it again.

    Raises LayoutRefused with the reason when anything is not as the write path needs it."""
    problem = ggml_graph.layout_problem()
    if problem:
        raise LayoutRefused(problem)
    col = _Collector()
    n_keep = len(engine.slot.tokens)  # decode after what is cached, then remove it: the cache survives
    if n_keep + 1 > engine.n_ctx:
        engine.slot.truncate(0)
        n_keep = 0
    try:
        tok = engine.tokenize("a", add_special=True)[:1] or [0]
        with engine.hooked(col):
            engine.slot.decode(tok, n_keep, logits_last=True)
        # Rope params and value shapes must be read while the graph is alive (its nodes are freed or
        # reused by the next decode); cache tensors themselves live as long as the context.
        layout = GraphLayout(set_rows_op=col.set_rows_op)
        found: dict[int, dict] = {}
        groups: dict[int, str] = {}
        for kind, il, idx_ptr, value, dst in col.writes:
            idx_name = groups.setdefault(idx_ptr, f"idx{len(groups)}")
            d = found.setdefault(il, {})
            # host or GPU memory alike (rows() copies through ggml's backend API off the host)
            if dst.type != GGML_TYPE_F16 or not dst.t.buffer or dst.nb[1] != dst.ne[0] * 2 or dst.ne[2] != 1:
                raise LayoutRefused(
                    f"{dst.name} is not a single-stream F16 tensor in a backend buffer (type {dst.type}, "
                    f"ne {dst.ne}); RidgeFill needs an F16 KV cache."
                )
            d[kind] = (CacheTensor(dst.name, dst.ptr, dst.ne[0], dst.ne[1]), idx_name)
            src = _root_op(value)
            if kind == "k":
                if src.op != "ROPE":
                    raise LayoutRefused(f"layer {il}'s K write does not come from a ROPE node ({src.op})")
                d["rope"] = _rope_params(src)
                d["k_shape"] = src.ne[:2]  # (head_dim, n_head_kv)
            else:
                d["v_shape"] = value.ne
        if col.error:
            raise LayoutRefused(f"graph discovery failed: {col.error}")
        for il, d in sorted(found.items()):
            if "k" not in d or "v" not in d or "rope" not in d:
                raise LayoutRefused(f"layer {il}: K or V cache write not found in the graph")
            head_dim, n_head_kv = d["k_shape"]
            kc, kidx = d["k"]
            vc, vidx = d["v"]
            if head_dim * n_head_kv != kc.n_embd_gqa or vc.n_embd_gqa % n_head_kv:
                raise LayoutRefused(f"layer {il}: K cache width {kc.n_embd_gqa} is not {n_head_kv}×{head_dim}")
            layout.layers[il] = LayerLayout(il, kc, vc, kidx, vidx, d["rope"], n_head_kv, head_dim,
                                            vc.n_embd_gqa // n_head_kv)
    finally:
        engine.slot.truncate(n_keep)
    if sorted(layout.layers) != list(range(engine.info.n_layer)):
        raise LayoutRefused(
            f"found KV caches for layers {sorted(layout.layers)}, expected 0..{engine.info.n_layer - 1}"
        )
    return layout


def read_index(node: Node) -> np.ndarray:
    """The I64 cell indices of one ubatch (a graph input, valid while that graph runs)."""
    if node.type != GGML_TYPE_I64:
        raise LayoutRefused(f"{node.name} is not I64")
    n = node.ne[0] * node.ne[1]
    return node.read(np.int64, (n,))


class CellTap:
    """Eval hook that records, per cell-index group, the cells a ubatch's rows are written to (graph
    inputs, set before compute, so read when the SET_ROWS node is offered); it wants no node."""

    def __init__(self, layout: GraphLayout):
        self.cache_index = layout.cache_index()
        self.set_rows_op = layout.set_rows_op
        self.first_group = layout.layers[min(layout.layers)].k_index
        self.reset()

    def reset(self) -> None:
        self.idx: dict[str, np.ndarray] = {}
        self.error: str | None = None

    def read_cells(self, tensor: int) -> bool:
        """True when `tensor` is a cache write (its cell indices are recorded); never raises into C."""
        if ggml_graph.view(tensor).op != self.set_rows_op:
            return False
        try:
            node = Node(tensor)
            group = self.cache_index.get(node.src(2).root().name)
            if group is not None and group not in self.idx:
                self.idx[group] = read_index(node.src(1))
        except Exception as exc:
            self.error = f"cell indices: {exc}"
        return True

    def first_layer_cells(self) -> np.ndarray | None:
        """The cells of layer 0's K cache (every layer's, without sliding-window caches)."""
        return self.idx.get(self.first_group)

    def wants(self, tensor: int) -> bool:
        self.read_cells(tensor)
        return False

    def seen(self, tensor: int) -> bool:  # pragma: no cover - nothing is wanted
        return True

