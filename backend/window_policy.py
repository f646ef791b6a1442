"""Which layers attend within a sliding window, and how far back: the one answer every part of RidgeFill
asks (the late K/V writes, the modes a plan may run, guided scoring, a saved state's cache sections).

The window comes from the GGUF (`*.attention.sliding_window`); which layers use it comes from the graph,
since llama.cpp sets most families' layer pattern in its own code, not in the file: with a window, it
keeps two caches (llama_kv_cache_iswa), and each layer writes through its cache's cell-index input.
No model family's pattern is written here. Made once per engine by the one that sees the graph,
RidgeFill's runtime (`rt.windows`, backend/ridgefill/runtime.py). Whether the model has a window at all
(the engine's pinned sequence, the default tail, what a saved state keeps) is asked before any graph
exists: that is the GGUF's window itself (`ModelInfo.has_sliding_window`), a policy's `window`.
"""
from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class WindowPolicy:
    n_layer: int
    window: int = 0  # how many rows back a windowed layer attends (the GGUF's); 0: the model has none
    windowed: frozenset[int] = frozenset()  # the layers that attend within the window

    def is_windowed(self, il: int) -> bool:
        return il in self.windowed

    @property
    def has_windows(self) -> bool:
        return bool(self.windowed)

    @property
    def global_layers(self) -> tuple[int, ...]:
        """The layers that attend to every row, in order."""
        return tuple(il for il in range(self.n_layer) if il not in self.windowed)

    def first_window_row(self, end: int) -> int:
        """The first row a windowed layer still reads when the exact rows begin at `end`."""
        return end - self.window


def window_policy(n_layer: int, window: int, caches: Mapping[int, tuple[Hashable, int]]) -> WindowPolicy:
    """The policy of a model whose GGUF gives `window` and whose layers write as `caches` says: layer ->
    (its cache's cell-index group, the cells that cache holds). Only two caches make windowed layers;
    one cache (or none named) keeps every row for every layer, which is what treating them global does."""
    if window <= 0:
        return WindowPolicy(n_layer)
    groups: dict[Hashable, set[int]] = {}
    cells: dict[Hashable, int] = {}
    for il, (group, n_cells) in caches.items():
        groups.setdefault(group, set()).add(il)
        cells[group] = n_cells
    if len(groups) != 2:
        return WindowPolicy(n_layer, window)
    # The window cache: the smaller one; with a full-size window cache (swa_full), the one with more
    # layers (llama.cpp's patterns put one global layer in each period); on a tie, the one holding layer 0
    # (llama.cpp's periods end with their global layer).
    win = min(groups, key=lambda g: (cells[g], -len(groups[g]), 0 not in groups[g]))
    return WindowPolicy(n_layer, window, frozenset(groups[win]))
