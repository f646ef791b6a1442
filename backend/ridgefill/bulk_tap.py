"""The eval hook of a bulk ubatch: the layers below the split run in llama.cpp and the graph stops there.

It reads each cache's cell indices and the stream entering the split (`l_out-(S-1)`); optionally it
makes every attention below the split read the sliding-window layers' mask (windowed bulk attention).
"""
from __future__ import annotations

import numpy as np

from . import ggml_graph
from .cache_layout import CellTap
from .ggml_graph import Node
from .run_mask import ATTENTION_MASK_SRC, MASK_DTYPES


class BulkTap(CellTap):
    """Eval hook for a bulk ubatch: reads each cache's cell indices and `l_out-(S-1)`, then stops the
    graph (yes to every later ask, no to every later 'go on', so further splits stop too). A cache
    first written by the split layer itself (Gemma 3's global cache at S = 5) has its cells read there:
    the graph goes on through that layer's K/V writes (its projections, not its attention) and stops.
    With `shared_cells` (every cache puts a row in the same cell: RidgeFillRuntime.windows_kept), a cache
    whose first layer is above the cut takes the cells read below it (Gemma 3 at S < 5).

    `windowed`: every attention below the split reads the sliding-window layers' mask, so a global layer
    there (Gemma 3's layer 5 at S = 6) attends to the window alone: its K/V stay exact, its output for
    bulk rows loses the far rows and costs what a sliding-window layer does
    (docs/LONG_DOCUMENTS.md#gemma-3-at-split-5-and-windowed-bulk-attention)."""

    def __init__(self, split: int, layout, windowed: bool = False, shared_cells: bool = False):
        self.cut_name = f"l_out-{split - 1}".encode()
        super().__init__(layout)
        self.groups = set(self.cache_index.values())
        self.windowed = windowed
        self.shared_cells = shared_cells

    def reset(self) -> None:
        super().reset()
        self.h: np.ndarray | None = None
        self.cut = False  # the split stream was read
        self.stopped = False  # the graph stops at the node asked for last
        self.window_mask: Node | None = None  # the first attention's mask (a sliding-window layer's)
        self.masks_windowed: set[int] = set()

    def _cells_complete(self) -> bool:
        return bool(self.idx) if self.shared_cells else self.groups <= self.idx.keys()

    def _share_cells(self) -> None:
        """Every group not read takes the first group's cells (the bulk pass refuses caches whose cells
        differ: injection._check_tap)."""
        first = next(iter(self.idx.values()))
        for group in self.groups - self.idx.keys():
            self.idx[group] = first

    def wants(self, tensor: int) -> bool:
        if self.stopped:
            return True
        if self.read_cells(tensor) or self.cut:
            # past the cut, the cache write that completes the cells is the last node computed
            self.stopped = self.cut and self._cells_complete()
            return self.stopped
        if self.windowed and self.error is None:
            self._window_attention(tensor)
        return ggml_graph.view(tensor).name == self.cut_name

    def _window_attention(self, tensor: int) -> None:
        """An attention node asked for before anything is computed (no node below the cut is wanted): its
        mask, a graph input already set (F16 with flash attention), becomes a copy of the first
        attention's (never raises into C)."""
        src = ATTENTION_MASK_SRC.get(ggml_graph.op_name(ggml_graph.view(tensor).op))
        if src is None:
            return
        try:
            mask = Node(tensor).src(src)
            if mask is not None and mask.op == "CPY":  # flash attention reads an F16 cast of the input
                mask = mask.src(0)
            dtype = MASK_DTYPES.get(mask.type) if mask is not None and mask.op == "NONE" else None
            if dtype is None:
                raise ValueError("the attention's mask is not an F32 or F16 graph input")
            if self.window_mask is None:
                self.window_mask = mask
            elif mask.ptr != self.window_mask.ptr and mask.ptr not in self.masks_windowed:
                first = self.window_mask
                if (mask.ne, mask.nb, mask.type) != (first.ne, first.nb, first.type) or \
                        mask.nb[1] != mask.ne[0] * np.dtype(dtype).itemsize:
                    raise ValueError(f"masks differ ({mask.ne} vs {first.ne})")
                shape = (mask.ne[1] * mask.ne[2] * mask.ne[3], mask.ne[0])
                if mask.through_api() or first.through_api():  # a mask in GPU memory: copied through ggml
                    mask.write(first.read(dtype, shape))
                else:
                    mask.array(dtype, shape)[:] = first.array(dtype, shape)
                self.masks_windowed.add(mask.ptr)
        except Exception as exc:
            self.error = f"windowed bulk attention: {exc}"

    def seen(self, tensor: int) -> bool:
        if self.stopped:
            return False
        t = ggml_graph.view(tensor)
        if t.name != self.cut_name:
            return True
        try:
            self.h = ggml_graph.Node(tensor).rows_f32()
        except Exception as exc:
            self.error = f"stream: {exc}"
        self.cut = True
        self.stopped = self._cells_complete() or self.error is not None
        if self.stopped and self.shared_cells and self.idx:
            self._share_cells()
        return not self.stopped

