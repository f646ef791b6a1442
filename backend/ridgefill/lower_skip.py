"""Rows decoded again through every layer (quality, guided) skip the layers below the split.

The bulk pass ran those layers exactly for every bulk row: the row record keeps each row's stream
entering the split (for follow-up questions too), and the row's lower-layer K/V sit in its old cell. So
the re-decode's graph need not run them again (at 8,000 tokens, 12 of SmolLM2's 30 layers: about 40% of
the re-decode). An eval hook makes every node of the layers below the split a no-op while the scheduler
asks about it (nodes are asked about before their chunk is computed), writes the kept stream into
`l_out-(S-1)` once that node is reached, and the layers from the split on run as usual. llama.cpp reuses
graphs, so the nodes get their ops back after the decode, whatever happens. The new cells' lower-layer
K/V are then copied from the old cells.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..row_record import RowRecord
from . import ggml_graph
from .cache_layout import GraphLayout
from .ggml_graph import GGML_TYPE_F32, Node

_LAYER_SUFFIX = re.compile(rb"-(\d+)$")
# Nodes that compute nothing (or are graph inputs): nothing to skip.
_EMPTY_OPS = {"NONE", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"}


@dataclass
class SplitStreams:
    """Where the streams entering the split of rows a bulk pass computed are kept (the row record,
    for this request and its follow-ups), and where the lower layers' caches are."""
    layout: GraphLayout
    split: int
    record: RowRecord

    def rows(self, positions: list[int]) -> np.ndarray | None:
        """The streams of `positions` in that order, or None if any was not kept."""
        return self.record.split_streams(self.split, positions)

    def lower_kv(self, old_cells, new_cells):
        """The lower layers' K/V of each row, from its old cell into its new one (same position, same
        history below the split: the same values), as the slot's writes (Slot.write_late)."""
        old, new = np.asarray(old_cells), np.asarray(new_cells)
        for il in range(self.split):
            ll = self.layout.layers[il]
            for cache in (ll.k_cache, ll.v_cache):
                yield cache, new, cache.rows()[old]


class LowerLayersSkipped:
    """Eval hook around `inner` (which reads the batch's cells and may edit its mask, and wants no
    node): parks the nodes of layers below the split as no-ops and writes `stream` (n_rows, n_embd) into
    `l_out-(split-1)`. `restore()` gives the parked nodes their ops back."""

    def __init__(self, inner, split: int, stream: np.ndarray):
        self.inner = inner
        self.split = split
        self.cut_name = f"l_out-{split - 1}".encode()
        self.stream = np.ascontiguousarray(stream, dtype=np.float32)
        self.in_layers = False  # a node of layer 0 was seen
        self.parked: list[tuple[int, int]] = []  # (tensor, its op)
        self.written = False
        self.error: str | None = None

    def wants(self, tensor: int) -> bool:
        self.inner.wants(tensor)  # first: it reads cells and the mask from nodes about to be parked
        if self.written or self.error:
            return False
        t = ggml_graph.view(tensor)
        m = _LAYER_SUFFIX.search(t.name)
        if m is not None:
            if int(m.group(1)) >= self.split:
                self.error = f"layer {int(m.group(1))} was reached before {self.cut_name.decode()}"
                return False
            self.in_layers = True
        if not self.in_layers or ggml_graph.op_name(t.op) in _EMPTY_OPS or _shared_mask_cast(tensor):
            return False
        self.parked.append((tensor, t.op))
        t.op = 0  # GGML_OP_NONE: the CPU backend skips it
        return t.name == self.cut_name

    def seen(self, tensor: int) -> bool:
        if self.written or ggml_graph.view(tensor).name != self.cut_name:
            return True
        try:
            node = Node(tensor)
            n_embd, n_rows = node.ne[0], node.ne[1]
            if node.type != GGML_TYPE_F32 or node.nb[1] != n_embd * 4 or (n_rows, n_embd) != self.stream.shape:
                raise ValueError(f"{node.name} is type {node.type}, ne {node.ne}; expected F32 "
                                 f"{self.stream.shape[1]} x {self.stream.shape[0]}, contiguous")
            node.write(np.ascontiguousarray(self.stream, dtype=np.float32))  # host or device memory
            self.written = True
        except Exception as exc:  # never raise into C
            self.error = f"split stream: {exc}"
        return True

    def restore(self) -> None:
        for tensor, op in reversed(self.parked):
            ggml_graph.view(tensor).op = op
        self.parked.clear()


def _shared_mask_cast(tensor: int) -> bool:
    """A cast of a graph input (the attention mask) that every layer reads: it must still run."""
    node = Node(tensor)
    src = node.src(0)
    return node.op in ("CPY", "CONT") and src is not None and src.op == "NONE" and \
        _LAYER_SUFFIX.search(src.t.name) is None
