"""quality mode: selected bulk rows decoded again exactly on other sequences and handed to sequence 0.

The mechanism is checked against exact with a map that predicts nothing (zeros): speed with it is far
from exact, quality with every bulk row selected must come back to exact, and with the digits selected
it must keep the number's rows exact while the rest stay approximated."""
from __future__ import annotations

import llama_cpp
import numpy as np
import pytest
import torch

from backend.protocol import CompletionRequest
from backend.ridgefill.plan import ridgefill_prefill
from backend.ridgefill.runtime import runtime
from backend.ridgefill.quality_rows import NUMBER_LEAD, NUMBER_TRAIL, select_runs, token_score
from backend.ridgefill.redecode import Run, batches
from backend.completion import complete
from test_ridgefill_injection import engine, induction_prompt, kl  # noqa: F401 - the module's engine fixture

SPLIT, TAIL = 18, 512


class ZeroMaps:
    """Predicts every late layer's input as zeros: the worst map, so approximated rows are obvious."""

    split, layers, warnings = SPLIT, list(range(SPLIT + 1, 30)), []

    def predict(self, layer, h_split):  # noqa: ARG002
        return torch.zeros(h_split.shape, dtype=torch.float32)


def seq_range(engine, seq):
    mem = llama_cpp.llama_get_memory(engine.context.handle)
    return llama_cpp.llama_memory_seq_pos_min(mem, seq), llama_cpp.llama_memory_seq_pos_max(mem, seq)


def others_empty(engine):
    return all(seq_range(engine, s)[1] == -1 for s in range(1, engine.n_seq))


def test_the_score_prefers_digits_then_names_and_numbers_bring_their_context(engine):
    n = engine.n_vocab
    assert token_score("7", 100, n) > token_score(" Paris", 100, n) > token_score(" the", 100, n)
    toks = engine.tokenize(("the cat sat on the mat and the rug was warm and the owl said its number is "
                            "4729185 and then the dog ran far away over the hills and back home again. ") * 3,
                           add_special=False)
    digits = [p for p, t in enumerate(toks) if engine.token_text(t).strip().isdigit()]
    assert len(digits) == 21  # SmolLM2 splits numbers into single digits
    runs = select_runs(engine, toks, 0, len(toks), share=0.7)  # room for the three numbers' windows
    covered = {p for r in runs for p in range(r.start, r.end)}
    firsts = [p for p in digits if p - 1 not in digits]
    for f in firsts:  # each number with the words that introduce it and the token that ends it
        assert set(range(f - NUMBER_LEAD, f + 7 + NUMBER_TRAIL)) <= covered
    holding = [next(i for i, r in enumerate(runs) if r.start <= f < r.end) for f in firsts]
    assert len(set(holding)) == 3  # one run per number: far apart, they are decoded separately
    assert len(covered) < len(toks)
    # the budget stops the selection: 10% of the rows is less than one number's window, so one window
    small = select_runs(engine, toks, 0, len(toks), share=0.1)
    assert len(small) == 1 and round(0.1 * len(toks)) <= len(small[0]) <= NUMBER_LEAD + 1 + NUMBER_TRAIL
    assert select_runs(engine, toks, 0, len(toks), share=1.0) == [Run(0, len(toks))]
    assert select_runs(engine, toks, 0, len(toks), share=0.0) == []


def test_runs_are_batched_by_rows_and_sequences():
    a, b, c = Run(0, 5), Run(10, 20), Run(30, 35)
    assert batches([a, b, c], max_rows=100, max_runs=2) == [[a, b], [c]]
    assert batches([a, b, c], max_rows=12, max_runs=9) == [[a], [b], [c]]
    assert batches([a, c], max_rows=10, max_runs=9) == [[a, c]] and batches([], 10, 9) == []
    # a run that starts where the one before ends needs its own call: its sequence must end just before it
    assert batches([a, Run(5, 8), c], max_rows=100, max_runs=9) == [[a], [Run(5, 8), c]]


def test_quality_with_every_row_selected_is_exact_and_the_zero_map_speed_is_not(engine):
    toks = induction_prompt(engine, 2030)
    engine.slot.prefill(toks, reuse_prefix=False)
    ref = engine.last_logits()

    speed = ridgefill_prefill(engine, toks, "speed", SPLIT, TAIL, maps=ZeroMaps())
    assert speed.mode == "speed" and speed.exact_n == 0
    kl_speed = kl(ref, engine.last_logits())

    full = ridgefill_prefill(engine, toks, "quality", SPLIT, TAIL, maps=ZeroMaps(), share=1.0)
    assert full.mode == "quality" and full.exact_n == full.bulk_n == len(toks) - TAIL, full.note
    assert full.breakdown_ms["exact_rows"] > 0
    kl_full = kl(ref, engine.last_logits())
    # the cache is one sequence again: sequence 0 holds every position once, the others nothing
    assert seq_range(engine, 0) == (0, len(toks) - 1) and others_empty(engine)
    print(f"KL vs off: speed with zero maps {kl_speed:.3f}, quality with every row exact {kl_full:.2e}")
    assert kl_speed > 0.5 and kl_full < 1e-2  # the same tolerance as plumb (see test_ridgefill_injection)
    # the next request on this cache decodes normally
    res = complete(engine, CompletionRequest(prompt="Hello", max_tokens=3))
    assert res.timings.prompt_n > 0 and res.finish_reason in ("stop", "length")


def test_quality_makes_the_selected_rows_exact_and_leaves_the_rest_approximated(engine):
    """Layer S+1's K of a bulk row is exact only if that row ran through layer S exactly (every row's
    layer-S K/V are exact, from the real stream): true for the selected rows in quality, for none in
    speed with zero maps (their layer S+1 input is predicted as zeros). Rows decoded again land in
    other cells, so each exact row is looked for among all cells."""
    owl = engine.tokenize("\n\nThe special magic number for owl is 4729185.\n\n", add_special=False)
    base = induction_prompt(engine, 2000)
    toks = base[:600] + owl + base[600:900] + owl + base[900:1900]
    engine.slot.prefill(toks, reuse_prefix=False)
    lay = runtime(engine).layout

    def k19():
        return lay.layers[SPLIT + 1].k_cache.rows().astype(np.float32)

    def found(rows, exact_rows):
        """For each exact row, the best cosine with any cell."""
        a = exact_rows / np.linalg.norm(exact_rows, axis=1, keepdims=True)
        c = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
        return (a @ c.T).max(1)

    exact = k19()[: len(toks)]  # a fresh exact prefill: cell i holds position i
    bulk = len(toks) - TAIL
    digits = [p for p in range(bulk) if engine.token_text(toks[p]).strip().isdigit()]
    # rows far from any number stay approximated (a number's window reaches NUMBER_LEAD rows back)
    plain = [p for p in range(100, bulk, 41) if all(abs(p - d) > NUMBER_LEAD + 3 for d in digits)][:12]
    assert len(digits) >= 14 and len(plain) == 12  # the two needles' digits, and the prose's own

    ridgefill_prefill(engine, toks, "speed", SPLIT, TAIL, maps=ZeroMaps())
    assert found(k19(), exact[digits]).max() < 0.99

    # a budget of exactly the numbers' windows, so no other row is taken
    windows = {q for d in digits for q in range(max(0, d - NUMBER_LEAD), d + 1 + NUMBER_TRAIL)}
    rep = ridgefill_prefill(engine, toks, "quality", SPLIT, TAIL, maps=ZeroMaps(), share=len(windows) / bulk)
    # rows between windows closer than MERGE_GAP are decoded with them
    assert rep.mode == "quality" and len(windows) <= rep.exact_n <= len(windows) + 2 * len(digits), rep.note
    assert seq_range(engine, 0) == (0, len(toks) - 1) and others_empty(engine)
    cells = k19()
    assert found(cells, exact[digits]).min() > 0.999  # every selected row ran through layer S exactly
    assert found(cells, exact[plain]).max() < 0.99  # the others stayed approximated


class Ident:
    """Predicts each late input as the split stream itself: far from exact."""

    warnings: list = []

    def __init__(self, split: int, n_layer: int):
        self.split, self.layers = split, list(range(split + 1, n_layer))

    def predict(self, layer, h):  # noqa: ARG002
        return h.float()


class Zero(Ident):
    """Predicts every late input as zeros."""

    def predict(self, layer, h):  # noqa: ARG002
        return torch.zeros(h.shape, dtype=torch.float32)


@pytest.mark.parametrize("arch,n_layer,split", [("qwen2", 4, 2), ("gemma3", 12, 7)])
def test_quality_on_tiny_models(tmp_path, arch, n_layer, split):
    """Every row made exact again gives exact's logits (F32 weights: KL ~ 0). gemma3 (a 64-row sliding
    window, 1,600 rows): each row decoded again deep in the prompt needs its window's rows, which the
    full-size sliding-window cache keeps and the late windows written before the re-decode fill."""
    from backend.engine import Engine, EngineConfig
    from tiny_gguf import write_tiny_gguf

    path = write_tiny_gguf(tmp_path / f"tiny-{arch}.gguf", arch, n_layer=n_layer)
    toks = [1] + [int(t) for t in np.random.default_rng(3).integers(3, 299, 1600)]
    with Engine(EngineConfig(str(path), n_ctx=2048, n_threads=2)) as e:
        e.slot.prefill(toks, reuse_prefix=False)
        ref = e.last_logits()
        rep = ridgefill_prefill(e, toks, "quality", split, TAIL, maps=Ident(split, n_layer), share=1.0)
        assert rep.mode == "quality" and rep.exact_n == rep.bulk_n == len(toks) - TAIL, rep.note
        assert kl(ref, e.last_logits()) < 1e-6
        assert seq_range(e, 0) == (0, len(toks) - 1)
        assert all(seq_range(e, s)[1] == -1 for s in e.spares.ids)
        ridgefill_prefill(e, toks, "speed", split, 64, maps=Zero(split, n_layer))
        # the control: maps that predict nothing, no exact rows (random tiny models' logits are flat: the
        # gap shows in the logits themselves)
        assert np.abs(ref - e.last_logits()).max() > 0.1


def test_guided_on_a_sliding_window_model_leaves_the_sequences_as_it_found_them(tmp_path):
    """guided on gemma3: the probe and the re-decode leave sequence 0 whole, the spare sequences empty,
    and the pin sequence on exactly sequence 0's cells; a follow-up (prefix reused) keeps them so."""
    from backend.engine import Engine, EngineConfig
    from tiny_gguf import write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "tiny-gemma3.gguf", "gemma3", n_layer=12)
    toks = [1] + [int(t) for t in np.random.default_rng(5).integers(3, 299, 1700)]
    with Engine(EngineConfig(str(path), n_ctx=4096, n_threads=2)) as e:
        maps = Ident(7, 12)
        rep = ridgefill_prefill(e, toks, "guided", 7, 64, maps=maps)
        assert rep.mode == "guided" and 0 < rep.exact_n < rep.bulk_n, rep.note
        more = toks + [int(t) for t in np.random.default_rng(6).integers(3, 299, 300)]
        again = ridgefill_prefill(e, more, "guided", 7, 64, maps=maps, reuse_prefix=True)
        assert again.mode == "guided" and again.cache_n > 0, again.note
        for n in (len(more),):
            assert seq_range(e, 0) == seq_range(e, e.pin_seq) == (0, n - 1)
        assert all(seq_range(e, s)[1] == -1 for s in e.spares.ids)
        cells = np.asarray(e.slot.record.cells(list(range(len(more)))))
        known = cells[cells >= 0]  # the exact tails' cells are not recorded
        assert len(set(known.tolist())) == len(known) >= len(more) - 2 * 64  # a cell of its own for each row


def test_redecoding_modes_run_as_speed_where_windows_are_evicted(tmp_path):
    """Without the full-size sliding-window cache, a row decoded again would miss its window: quality and
    guided run as speed and say why."""
    from backend.engine import Engine, EngineConfig
    from tiny_gguf import write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "tiny-gemma3.gguf", "gemma3", n_layer=12)
    toks = [1] + [int(t) for t in np.random.default_rng(3).integers(3, 299, 1600)]
    with Engine(EngineConfig(str(path), n_ctx=2048, n_threads=2, swa_full=False)) as e:
        assert e.pin_seq is None
        for mode in ("quality", "guided"):
            rep = ridgefill_prefill(e, toks, mode, 7, TAIL, maps=Ident(7, 12), share=1.0)
            assert rep.mode == "speed" and rep.exact_n == 0 and "sliding window" in rep.note, rep.note


def test_a_row_decoded_again_deep_in_a_long_prompt_sees_its_window(tmp_path):
    """gemma3, split 7: a row guided decodes again far before the tail attends, at the sliding-window
    layer 7, to the 63 rows before it, whose layer-7 K/V the bulk pass did not write (only the tail reads a
    window there). Written before the re-decode from the kept split streams (exact at layer 7), they make
    the row's layer-8 keys equal exact's; left unwritten, they do not."""
    from backend.engine import Engine, EngineConfig
    from backend.ridgefill.guided import GuidedParams
    from tiny_gguf import write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "tiny-gemma3.gguf", "gemma3", n_layer=12)
    toks = [1] + [int(t) for t in np.random.default_rng(8).integers(3, 299, 2400)]
    split, tail = 7, 64
    with Engine(EngineConfig(str(path), n_ctx=4096, n_threads=2)) as ref:
        ref.slot.prefill(toks, reuse_prefix=False)
        layer8 = runtime(ref).layout.layers[split + 1]
        exact_k = layer8.k_cache.rows()[: len(toks)].astype(np.float32)  # a fresh context fills cells in order
    with Engine(EngineConfig(str(path), n_ctx=4096, n_threads=2)) as e:
        params = GuidedParams(peaks=1, also_peaks=0, head=1200, budget=16, contrast=False)
        rep = ridgefill_prefill(e, toks, "guided", split, tail, maps=Zero(split, 12), guided=params)
        approx = set(e.slot.record.approximated(0, len(toks)))
        redone = [p for p in range(params.head, len(toks) - tail) if p not in approx]
        assert rep.exact_n == len(redone) > 0, rep.note
        assert min(redone) < len(toks) - tail - 2 * 64  # its window lies where the bulk pass wrote nothing
        k = runtime(e).layout.layers[split + 1].k_cache.rows()[np.asarray(e.slot.record.cells(redone))]
        err = np.abs(k.astype(np.float32) - exact_k[redone]).max() / np.abs(exact_k[redone]).max()
        assert err < 1e-2, err
