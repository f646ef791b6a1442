"""A sequence state of several caches (gemma3: the global layers' cache, then the sliding-window layers'
holding the last window only): its rows' cells after a load are the global cache's, the one whose layers
the sources read (issue 38).

Synthetic states are written byte for byte as backend/seq_state.py documents them; the last test reads a
real one, saved by llama.cpp from a tiny random-weight gemma3, back into a new engine."""
from __future__ import annotations

import struct

import numpy as np
import pytest

from backend.seq_state import CacheSection, StateLayout, read_layout

ROW_BYTES = 4  # one tiny K or V row per cell


def _section(positions: list[int], n_layer: int, tag: int) -> bytes:
    """One cache's part of a state; K row bytes say (tag, layer, cell) so a test can tell them apart."""
    out = struct.pack("<II", 1, len(positions))
    for p in positions:
        out += struct.pack("<iIi", p, 1, 0)
    out += struct.pack("<II", 0, n_layer)
    for kind in (0, 1):  # K layers, then V layers
        for il in range(n_layer):
            out += struct.pack("<iQ", 1, ROW_BYTES)
            out += b"".join(bytes([tag, il, cell, kind]) for cell in range(len(positions)))
    return out


def _state(*sections: bytes) -> bytes:
    return b"MARK0001" + b"".join(sections)


GLOBAL = [2, 0, 1, 5, 3, 4]  # every position, in a cell order that is not position order
WINDOW = [4, 5, 3]  # the sliding-window cache's last window


def test_two_caches_give_the_global_caches_cells():
    blob = _state(_section(GLOBAL, 2, tag=7), _section(WINDOW, 3, tag=9))
    layout = read_layout(blob)
    # position p lands in the cell its global section lists it at
    assert layout.cells_after_load().tolist() == [GLOBAL.index(p) for p in range(6)]
    assert [len(s.positions) for s in layout.sections] == [6, 3] and layout.n_rows == 6
    assert layout.full_section() == 0
    assert layout.k0_rows(blob, 0).tolist() == [[7, 0, c, 0] for c in range(6)]
    assert layout.k0_rows(blob, 1).tolist() == [[9, 0, c, 0] for c in range(3)]


def test_one_cache_is_as_before():
    layout = read_layout(_state(_section(GLOBAL, 3, tag=1)))
    assert layout.full_section() == 0
    assert layout.cells_after_load().tolist() == [1, 2, 0, 4, 5, 3]


def _positions_only(*positions: list[int]) -> StateLayout:
    return StateLayout(b"M" * 8, [CacheSection(np.array(p, dtype=np.int64), 1, 0, ROW_BYTES) for p in positions])


def test_the_section_holding_every_row_is_taken_wherever_it_is():
    layout = _positions_only([1, 2], [3, 0], [1, 0])
    assert layout.full_section() == 2 and layout.cells_after_load().tolist() == [1, 0]


def test_no_section_holding_every_row_gives_none():
    assert _positions_only([1, 1], [0]).full_section() is None
    assert _positions_only([1, 1], [0]).cells_after_load() is None


@pytest.mark.parametrize("extra", [[6], [0, 0]])
def test_a_window_cache_with_rows_the_global_one_lacks_is_refused(extra):
    from backend.seq_state import StateFormatError

    with pytest.raises(StateFormatError, match="sliding-window cache"):
        read_layout(_state(_section(GLOBAL, 2, tag=7), _section(extra, 3, tag=9)))


def test_a_real_gemma3_state_reloads_with_every_rows_global_cell(tmp_path):
    """llama.cpp's own two-cache state of a tiny gemma3, saved by one engine and restored into another:
    every row gets a cell, each the global cache's (its K rows are the saved ones), and the sources find
    the document in it."""
    from backend.documents import DocumentText
    from backend.engine import Engine, EngineConfig
    from backend.prompt_cache import PromptCache
    from backend.prompt_reuse import restore, save_rows
    from backend.ridgefill.runtime import runtime
    from backend.sources import answer_sources
    from tiny_gguf import write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "tiny-gemma3.gguf", "gemma3", n_layer=12)
    cache = PromptCache(tmp_path / "prompts")
    # ~700 rows; no spaces: the tiny vocabulary writes a space as "▁", which is not the document's text
    words = "\n".join(f"Fact{i}:{i * 7919 % 1000}." for i in range(60))
    doc = DocumentText(name="doc.txt", text=words)
    with Engine(EngineConfig(str(path), n_ctx=2048, n_threads=2)) as a, \
            Engine(EngineConfig(str(path), n_ctx=2048, n_threads=2)) as b:
        toks = a.tokenize(words + "\nFact7?", add_special=True)
        a.slot.prefill(toks, reuse_prefix=False)
        assert save_rows(a, cache) is not None
        rt = runtime(b)  # set up first: the load's cells are then checked against the live cache
        assert rt.windows.has_windows and not rt.windows.is_windowed(5)
        assert restore(b, cache, toks, None) == "" and len(b.slot.record) == len(toks)
        assert b.slot.record.cells(list(range(len(toks)))) == list(range(len(toks)))
        # a prefilled row p into cell p of a fresh cache: b's cell p holds the same global K row
        live, a_live = (runtime(e).layout.layers[5].k_cache.rows()[: len(toks)] for e in (b, a))
        assert np.array_equal(live.view(np.uint8), a_live.view(np.uint8))
        found, why = answer_sources(b, toks, [doc])
        assert why == "" and found and all(s.text in words for s in found)


def test_more_than_a_window_of_new_rows_after_a_saved_gemma3_state_is_prefilled_instead(tmp_path):
    """After a two-cache load the window cache's cells differ from the global cache's: a prompt that adds
    more than a window of rows (a document attached after the reload) is not served from the entry, which
    stays; one adding a question's rows is."""
    from backend.engine import Engine, EngineConfig
    from backend.prompt_cache import PromptCache
    from backend.prompt_reuse import restore, save_rows
    from tiny_gguf import write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "tiny-gemma3.gguf", "gemma3", n_layer=12)
    cache = PromptCache(tmp_path / "prompts")
    words = "\n".join(f"Fact{i}:{i * 7919 % 1000}." for i in range(60))
    more = "\n".join(f"Other{i}:{i * 104729 % 1000}." for i in range(40))
    with Engine(EngineConfig(str(path), n_ctx=2048, n_threads=2)) as a, \
            Engine(EngineConfig(str(path), n_ctx=2048, n_threads=2)) as b:
        toks = a.tokenize(words, add_special=True)
        a.slot.prefill(toks, reuse_prefix=False)
        assert save_rows(a, cache) is not None
        window = b.info.sliding_window
        assert 0 < window < len(toks)
        longer = toks + b.tokenize("\n" + more, add_special=False)
        assert len(longer) - len(toks) > window
        note = restore(b, cache, longer, None)
        assert "sliding-window" in note and len(b.slot.record) == 0
        assert len(cache.entries()) == 1  # the entry stays
        question = toks + b.tokenize("\nFact7?", add_special=False)
        assert restore(b, cache, question, None) == "" and len(b.slot.record) == len(toks)
