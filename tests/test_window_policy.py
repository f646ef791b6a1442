"""The window policy: the GGUF's window on the layers the graph shows writing to the window cache."""
from __future__ import annotations

from backend.window_policy import WindowPolicy, window_policy


def _caches(n_layer: int, global_layers: set[int], global_cells: int = 4096, window_cells: int = 4096) -> dict:
    """Each layer's (cell-index group, cells) as the layout discovery reports them."""
    return {il: ("g", global_cells) if il in global_layers else ("w", window_cells) for il in range(n_layer)}


def test_a_model_without_a_window_has_no_windowed_layer():
    p = window_policy(30, 0, _caches(30, set()))
    assert p == WindowPolicy(30) and not p.has_windows and p.global_layers == tuple(range(30))
    assert not any(p.is_windowed(il) for il in range(30))


def test_one_cache_with_a_window_named_keeps_every_row_for_every_layer():
    p = window_policy(8, 256, _caches(8, set()))
    assert p.window == 256 and not p.has_windows and p.global_layers == tuple(range(8))


def test_every_fourth_layer_global_comes_from_the_graph_not_a_family_pattern():
    """A pattern other than Gemma 3's every 6th: globals 3, 7, 11 with a full-size window cache."""
    p = window_policy(12, 1024, _caches(12, {3, 7, 11}))
    assert p.global_layers == (3, 7, 11) and p.windowed == frozenset(range(12)) - {3, 7, 11}
    assert p.is_windowed(0) and not p.is_windowed(7) and p.first_window_row(5000) == 3976


def test_the_smaller_cache_is_the_window_cache():
    """Without a full-size window cache llama.cpp sizes it to the window: it decides before the count."""
    p = window_policy(6, 128, _caches(6, {0, 1, 2, 3}, global_cells=4096, window_cells=512))
    assert p.windowed == frozenset({4, 5}) and p.global_layers == (0, 1, 2, 3)


def test_alternating_layers_take_layer_0s_cache_as_the_window_cache():
    """Half and half, same size (every other layer global, as llama.cpp's 2-periods): layer 0's is windowed."""
    p = window_policy(6, 4096, _caches(6, {1, 3, 5}))
    assert p.windowed == frozenset({0, 2, 4}) and p.global_layers == (1, 3, 5)
