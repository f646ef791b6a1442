"""Refinement's own llama.cpp context, where a chunk of rows attends to the rows before it only.

In sequence 0's cache a refinement chunk's attention spans every cached row, the approximated rows
after it masked (llama.cpp sizes a batch's attention by the highest used cell, and its flash-attention
kernel checks each masked cell for every row and head): each chunk paid for the whole document. Here a
second context on the same loaded model (a cache of its own, and a slot of its own with its own record:
backend/slot.py) holds only the clean prefix:
a chunk of bulk rows runs the layers from the split on from their kept streams (lower_skip), attends to
the rows before it as exact's prefill does, and its K/V of those layers are then copied into sequence
0's cells at the same positions (same tokens, same positions, same exact history: the values an exact
decode writes there; the lower layers' K/V there are exact already). Measured:
docs/measurements/prompt-cache.md#refinement-in-its-own-context.
"""
from __future__ import annotations

import numpy as np

from .cache_layout import CellTap, GraphLayout, LayoutRefused, discover
from .lower_skip import LowerLayersSkipped

# A clean prefix this context does not hold (the prompt's head, a follow-up's exact rows) is decoded
# here again exactly up to this many rows, about one chunk's time; a longer one (a document reopened
# half refined) is refined in sequence 0's cache instead.
SEED_MAX_ROWS = 512


class RefineContext:
    """A second context of `engine`'s model whose sequence 0 holds `engine`'s clean prefix, upper layers."""

    def __init__(self, engine):
        self.main = engine
        # Its sliding-window layers need only a chunk's window: no full-size window cache.
        self.context = engine.sibling(engine.n_ctx, swa_full=False)
        try:
            self.layout = discover(self.context)
        except Exception:
            self.context.close()
            raise
        self.slot = self.context.slot  # its sequence 0: what it holds, from position 0, in its own record
        # the lowest layer whose K/V are exact for every row it holds (a refined chunk skipped the ones
        # below its split): a chunk at a lower split would read those
        self.exact_from = 0

    def close(self) -> None:
        self.context.close()

    def serves(self, engine, end: int) -> bool:
        """Whether it can refine `engine`'s rows up to `end` (the same engine, room for them)."""
        return self.main is engine and end <= self.context.n_ctx

    def hold_prefix(self, start: int, split: int, abort=None) -> bool:
        """Make sequence 0 hold the main engine's rows [0, start), exact from layer `split` on (dropping
        any after them); False when it holds other rows and `start` is too long to decode again here
        (see SEED_MAX_ROWS). `abort`: as in `refine`."""
        prefix = self.main.slot.tokens[:start]
        if self.slot.holds(prefix) and self.exact_from <= split:
            self._truncate(start)
            return True
        if start > SEED_MAX_ROWS:
            return False
        self._truncate(0)
        self.exact_from = 0
        step = self.context.ubatch_rows
        for p in range(0, start, step):  # clean rows: an exact decode writes what the main cache holds
            q = min(start, p + step)
            self.slot.decode(prefix[p:q], p, abort=abort)
        return True

    def refine(self, start: int, end: int, split: int, stream: np.ndarray, main_layout: GraphLayout,
               abort=None) -> np.ndarray:
        """Decode rows [start, end) here from their streams entering `split`, right after the prefix it
        holds, and copy their K/V of layers split.. into the main cache's cells of those rows (exact and
        clean there now); returns those cells. `abort`: asked inside the decode (Preempted, and nothing of the chunk stays on
        either side)."""
        if len(self.slot) != start or self.exact_from > split:
            raise ValueError(f"the refinement context holds {len(self.slot)} rows exact from layer "
                             f"{self.exact_from}, not {start} from {split}")
        main_cells = np.asarray(self.main.slot.record.cells(list(range(start, end))))
        if len(main_cells) != end - start or main_cells.min() < 0:
            raise ValueError(f"rows {start}..{end} have no known cell in the main cache")
        tokens = self.main.slot.tokens[start:end]
        tap = CellTap(self.layout)
        skip = LowerLayersSkipped(tap, split, stream)
        try:
            self.slot.decode(tokens, start, hook=skip, abort=abort)
        finally:
            skip.restore()
        self.exact_from = max(self.exact_from, split)
        if skip.error or not skip.written or tap.error:
            self._truncate(start)
            raise LayoutRefused(f"refinement context: {skip.error or tap.error or 'no split stream written'}")
        self.main.slot.copy_exact_rows(start, end, main_cells, self._copies(split, main_layout, tap))
        return main_cells

    def _copies(self, split: int, main_layout: GraphLayout, tap: CellTap):
        """The K/V rows of layers split.. this context wrote, as writes into the main cache's cells."""
        for il in range(split, self.main.info.n_layer):
            src, dst = self.layout.layers[il], main_layout.layers[il]
            yield dst.k_cache, src.k_cache.rows()[tap.idx[src.k_index]]
            yield dst.v_cache, src.v_cache.rows()[tap.idx[src.v_index]]

    def _truncate(self, n_keep: int) -> None:
        if len(self.slot) > n_keep:
            self.slot.truncate(n_keep)
