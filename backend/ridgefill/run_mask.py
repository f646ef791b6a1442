"""One llama_decode for runs that must each see the runs before them exact (guided's re-decode).

redecode_exact puts each run of a batch on its own sequence, which shares sequence 0's cells before the
run. llama.cpp's mask then hides from a run the new rows of the runs before it (they are on other
sequences) and shows it their approximate cells instead. Decoding run after run avoids that, but a run
of a few dozen rows takes llama.cpp's per-row flash-attention kernel, about twice as slow per row as the
tiled kernel (GGML_FA_TILE_Q) a decode of 64 rows or more gets (docs/measurements/guided-design.md#one-call-re-decode).

This eval hook edits the batch's attention mask, a graph input that is already set when the scheduler
asks about the first node and is read first by layer 0's attention: each run's queries are shown the new
cells of the runs before it. The approximate cells those replace are not on the run's sequence (the
caller removes them), so the batch computes what run-after-run decodes would, in one ubatch.
"""
from __future__ import annotations

import numpy as np

from . import ggml_graph
from .cache_layout import CellTap
from .ggml_graph import GGML_TYPE_F16, GGML_TYPE_F32, Node

ATTENTION_MASK_SRC = {"FLASH_ATTN_EXT": 3, "SOFT_MAX": 1}  # op -> which src is the KQ mask
MASK_DTYPES = {GGML_TYPE_F32: np.float32, GGML_TYPE_F16: np.float16}  # the mask input's types


def supported(cells: CellTap) -> bool:
    """Every layer's K cache takes the cells layer 0's does (no sliding-window cache of its own)."""
    return {g for name, g in cells.cache_index.items() if name.startswith("cache_k_")} == {cells.first_group}


class EarlierRunsVisible:
    """Reads the batch's cells (as `cells` does) and, before the first attention runs, unmasks for each
    run's rows the cells of the runs before it in the batch (`lengths`, in batch order)."""

    def __init__(self, cells: CellTap, lengths: list[int]):
        self.cells = cells
        self.lengths = lengths
        self.edited: set[int] = set()  # the mask tensors edited (one without sliding-window layers)
        self.error: str | None = None

    def wants(self, tensor: int) -> bool:
        if self.cells.read_cells(tensor):
            return False
        src = ATTENTION_MASK_SRC.get(ggml_graph.op_name(ggml_graph.view(tensor).op))
        if src is None or self.error:
            return False
        try:
            self._unmask(Node(tensor).src(src))
        except Exception as exc:  # never raise into C
            self.error = f"attention mask: {exc}"
        return False

    def seen(self, tensor: int) -> bool:  # pragma: no cover - nothing is wanted
        return True

    def _unmask(self, mask: Node | None) -> None:
        if mask is None:
            raise ValueError("the attention has no mask")
        if mask.op == "CPY":  # flash attention reads an F16 cast of the F32 input, computed after this
            mask = mask.src(0)
        if mask.ptr in self.edited:
            return
        if self.edited:
            raise ValueError("a second attention mask (sliding-window layers?)")
        if mask.op != "NONE":
            raise ValueError(f"the mask is computed by {mask.op}, not a graph input")
        cells = self.cells.first_layer_cells()
        n = sum(self.lengths)
        if cells is None or len(cells) != n:
            raise ValueError("the batch's cells were not seen before its first attention")
        dtype = MASK_DTYPES.get(mask.type)
        n_kv, n_rows = mask.ne[0], mask.ne[1]
        if dtype is None or mask.ne[2] * mask.ne[3] != 1 or mask.nb[1] != n_kv * np.dtype(dtype).itemsize:
            raise ValueError(f"unexpected mask (type {mask.type}, ne {mask.ne}, nb {mask.nb})")
        if n_rows < n or int(cells.max()) >= n_kv:
            raise ValueError(f"mask {n_rows}x{n_kv} does not cover {n} rows in cells up to {cells.max()}")
        on_device = mask.through_api()
        m = mask.read(dtype, (n_rows, n_kv)) if on_device else mask.array(dtype, (n_rows, n_kv))
        at = 0
        for length in self.lengths:
            if at:
                m[np.ix_(np.arange(at, at + length), cells[:at])] = 0  # visible, no bias (no ALiBi)
            at += length
        if on_device:  # a copy was edited: back into the device's mask
            mask.write(m)
        self.edited.add(mask.ptr)
