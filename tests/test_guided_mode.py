"""guided mode: the question's attention at the exact lower layers picks the bulk rows made exact.

Checked with a map that predicts zeros (so approximated rows are obvious) on the embedded model: the
probe leaves the cache as it found it; every bulk row selected gives exact's logits; scores from a
hand-made attention pattern select the rows they point at; a follow-up question re-decodes only rows
that are not exact yet."""
from __future__ import annotations

import llama_cpp
import numpy as np
import torch

from backend.ridgefill.guided import (GuidedParams, attention_scores, combined, contrasted, pooled, probe_streams,
                                     select)
from backend.ridgefill.plan import ridgefill_prefill
from test_quality_mode import ZeroMaps, others_empty, seq_range
from test_ridgefill_injection import engine, induction_prompt, kl  # noqa: F401 - the module's engine fixture

SPLIT, TAIL = 18, 512


def test_scores_from_a_hand_made_attention_pattern_select_the_rows_it_points_at():
    torch.manual_seed(0)
    n, w, n_head, n_kv, d = 300, 8, 6, 2, 16
    keys = torch.randn(n, n_kv, d) * 0.1
    queries = torch.randn(w, n_head, d) * 0.1
    # one retrieval head (head 4, KV group 1) looks hard at row 137; the other heads look nowhere
    keys[137, 1] = 4.0 * torch.ones(d) / d**0.5
    queries[:, 4] = 4.0 * torch.ones(d) / d**0.5
    s = attention_scores(queries, keys, d)
    assert int(s.argmax()) == 137
    # summing over heads instead of max dilutes the one head: its peak stands out less
    s_sum = attention_scores(queries, keys, d, heads="sum")
    assert s[137] / s.median() > s_sum[137] / s_sum.median()
    p = GuidedParams(back=4, forward=20, budget=20, pool=5)
    runs = select(list(range(n)), pooled(s, p.pool), n, p, max_run=512)
    chosen = {q for r in runs for q in range(r.start, r.end)}
    assert set(range(133, 158)) <= chosen  # 4 rows back, 20 forward: the value that follows the key
    assert len(chosen) <= p.budget + p.back + p.forward + 1
    # the window's own keys take the mass a query gives its neighbours
    own = keys[:w].clone()
    own[:, 1] = 8.0 * torch.ones(d) / d**0.5
    assert attention_scores(queries, keys, d, own)[137] < s[137]


def test_with_rows_max_one_query_row_that_looks_hard_outranks_many_that_look_a_little():
    torch.manual_seed(0)
    n, w, n_head, n_kv, d = 200, 8, 2, 1, 16
    keys = torch.randn(n, n_kv, d) * 0.1
    queries = torch.randn(w, n_head, d) * 0.1
    keys[40, 0] = torch.ones(d) / d**0.5  # seven rows look a little at row 40
    queries[:7, :] = 2.5 * torch.ones(d) / d**0.5
    keys[150, 0] = -torch.ones(d) / d**0.5  # the last row (the word that asks) looks hard at row 150
    queries[7, :] = -6.0 * torch.ones(d) / d**0.5
    summed, most = attention_scores(queries, keys, d), attention_scores(queries, keys, d, rows="max")
    assert int(summed.argmax()) == 40
    assert int(most.argmax()) == 150


def test_a_line_break_ends_a_sentence_only_where_the_rule_says():
    from backend.ridgefill.guided import sentence_ends

    wrapped = ["You", " must", " cure", " it", " within", "\n", "thirty", " days", ".", " Then"]
    assert sentence_ends(wrapped, "line")[0] == 5  # the line break
    assert sentence_ends(wrapped, "wrap")[0] == 8  # the line goes on in lower case: to the full stop
    assert sentence_ends(wrapped, "paragraph")[0] == 8
    listed = ["-", " apples", " and", "\n", "-", " pears", "\n", "\n", "Next"]
    assert sentence_ends(listed, "wrap")[0] == 3  # the next line is a new item
    assert sentence_ends(listed, "paragraph")[0] == 6  # only the blank line
    assert sentence_ends(wrapped, "wrap")[7] == 9  # none after: the last row


def test_a_place_reaches_back_to_its_sentences_start_within_its_bounds():
    from backend.ridgefill.guided import sentence_starts

    pieces = ["Tools", ".", " The", " OpenPGP", " standard", " is", " defined", " by", " RFC", "4880", ".", " Next"]
    assert sentence_starts(pieces) == [0, 0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 11]
    peak = torch.zeros(len(pieces))
    peak[9] = 1.0  # the answer's row
    ends = [len(pieces) - 1] * len(pieces)

    def rows(**kw):
        p = GuidedParams(peaks=1, also_peaks=0, head=0, forward=1, **kw)
        runs = select(list(range(len(pieces))), peak, len(pieces), p, 512, ends, starts=sentence_starts(pieces))
        return [q for r in runs for q in range(r.start, r.end)]

    assert rows(back=32, back_min=2) == list(range(2, 11))  # from "The": the question's words are exact too
    assert rows(back=4, back_min=2) == list(range(5, 11))  # at most `back`
    assert rows(back=32, back_min=8) == list(range(1, 11))  # at least `back_min`, across the sentence's start
    assert rows(back=4, back_min=4) == list(range(5, 11))  # back_min == back: the fixed rows, as before


def test_the_contrast_question_takes_off_what_every_question_looks_at():
    """A 'magnet' row draws every question's attention (a structural head); the asked row draws only this
    question's, and less of it. Scores as they are pick the magnet; minus the contrast question's, the
    asked row."""
    torch.manual_seed(0)
    n, w, n_head, n_kv, d = 300, 8, 6, 2, 16
    keys = torch.randn(n, n_kv, d) * 0.1
    keys[50, 0] = 6.0 * torch.ones(d) / d**0.5  # the magnet, in KV group 0
    keys[137, 1] = 3.0 * torch.ones(d) / d**0.5  # the asked row, in KV group 1
    question, other = torch.randn(w, n_head, d) * 0.1, torch.randn(w, n_head, d) * 0.1
    for q in (question, other):
        q[:, 0] = 6.0 * torch.ones(d) / d**0.5  # head 0 (group 0) goes to the magnet whatever is asked
    question[:, 4] = 3.0 * torch.ones(d) / d**0.5  # head 4 (group 1) goes to the asked row
    per_layer = {7: attention_scores(question, keys, d)}
    per_layer_other = {7: attention_scores(other, keys, d)}
    assert int(combined(per_layer, [7], 5).argmax()) in range(48, 53)
    assert int(contrasted(per_layer, per_layer_other, [7], 5).argmax()) in range(135, 140)


def test_the_contrast_prompt_asks_its_own_question_in_the_same_frame(engine):
    from backend.documents import document_messages
    from backend.protocol import CompletionRequest
    from backend.ridgefill.guided import CONTRAST_QUESTION, contrast_prompt

    doc = engine.detokenize(induction_prompt(engine, 600)[1:])
    toks = engine.prompt_tokens(CompletionRequest(messages=document_messages(doc, "Who kept the lighthouse?")))
    other = contrast_prompt(engine, toks, 32)
    assert other[: len(toks) - 32] == toks[: len(toks) - 32]  # the document as it is
    text, own = engine.detokenize(other[-32:]), engine.detokenize(toks[-32:])
    header = own.split("lighthouse?")[-1]  # the template's end of turn and assistant header
    assert f"Question: {CONTRAST_QUESTION}{header}" in text and text.endswith(header) and "lighthouse" not in text


def _state(engine):
    mem = llama_cpp.llama_get_memory(engine.context.handle)
    return [(llama_cpp.llama_memory_seq_pos_min(mem, s), llama_cpp.llama_memory_seq_pos_max(mem, s))
            for s in range(engine.n_seq)], engine.slot.tokens, engine.slot.record.approximated()


def test_the_probe_leaves_the_cache_as_it_found_it(engine):
    toks = induction_prompt(engine, 2000)
    bulk = len(toks) - TAIL
    engine.slot.prefill(toks[:bulk], reuse_prefix=False)
    engine.slot.decode(toks[bulk : bulk + 1], bulk, logits_last=True)
    ref = engine.last_logits()
    before = _state(engine)
    streams = probe_streams(engine, toks, [5, 9], window=32)
    assert set(streams) == {5, 9} and streams[5].shape == (32, engine.info.n_embd)
    assert _state(engine) == before  # every sequence's positions, the record of every row
    # the cells are free again and hold what they held: the next rows decode as if no probe had run
    engine.slot.truncate(bulk)
    engine.slot.decode(toks[bulk : bulk + 1], bulk, logits_last=True)
    assert kl(ref, engine.last_logits()) < 1e-9


def exact_then_every_row_guided(engine, toks):
    """(exact's last logits, the bulk row count, the report of guided with a budget covering every bulk
    row) for `toks`."""
    engine.slot.prefill(toks, reuse_prefix=False)
    ref = engine.last_logits()
    bulk = len(toks) - TAIL
    rep = ridgefill_prefill(engine, toks, "guided", SPLIT, TAIL, maps=ZeroMaps(),
                            guided=GuidedParams(budget=bulk, forward=bulk, back=bulk, back_min=bulk))
    return ref, bulk, rep


def test_guided_with_every_bulk_row_selected_equals_off(engine):
    toks = induction_prompt(engine, 2030)
    ref, bulk, full = exact_then_every_row_guided(engine, toks)
    assert full.mode == "guided" and full.exact_n == full.bulk_n == bulk, full.note
    assert {"probe", "score", "exact_rows"} <= set(full.breakdown_ms)
    assert seq_range(engine, 0) == (0, len(toks) - 1) and others_empty(engine)
    assert engine.slot.record.approximated() == []
    assert kl(ref, engine.last_logits()) < 1e-2  # plumb's tolerance (see test_ridgefill_injection)
    few = ridgefill_prefill(engine, toks, "guided", SPLIT, TAIL, maps=ZeroMaps())  # the default budget
    assert 0 < few.exact_n < bulk // 2  # the default budget (512 rows) is a third of this bulk
    assert kl(ref, engine.last_logits()) > 0.1  # the control: most rows still from zero maps


def test_a_follow_up_redecodes_only_rows_not_exact_yet(engine, monkeypatch):
    from backend.ridgefill import redecode
    from backend.ridgefill.lower_skip import LowerLayersSkipped

    skips = []

    class Recorded(LowerLayersSkipped):
        def restore(self):
            super().restore()
            skips.append(self.written and self.error is None)

    monkeypatch.setattr(redecode, "LowerLayersSkipped", Recorded)
    owl = engine.tokenize("\n\nThe special magic number for owl is 4729185.\n\n", add_special=False)
    gate = engine.tokenize("\n\nThe locker code for the blue gate is 1122334.\n\n", add_special=False)
    base = induction_prompt(engine, 2000)
    doc = base[:300] + owl + base[300:1100] + gate + base[1100:1600]
    first = doc + base[1600:1600 + TAIL] + engine.tokenize("\n\nWhat is the special magic number for owl? ",
                                                            add_special=False)
    maps = ZeroMaps()  # one instance: prefix reuse compares the maps that wrote the rows
    # places few enough that the first question leaves the other fact approximated
    few = GuidedParams(peaks=8, budget=256, back=4)
    rep1 = ridgefill_prefill(engine, first, "guided", SPLIT, TAIL, maps=maps, guided=few)
    exact_after_first = set(range(len(first) - TAIL)) - set(engine.slot.record.approximated())
    assert rep1.exact_n == len(exact_after_first) > 0
    # the same question again on the same cache: what it points to is exact already (rows made exact
    # are scored too and fill the budget), so little or nothing is decoded again
    again = ridgefill_prefill(engine, first + [first[-1]], "guided", SPLIT, TAIL, maps=maps, reuse_prefix=True,
                              guided=few)
    print(f"first question: {rep1.exact_n} rows made exact; the same again: {again.exact_n}")
    assert again.cache_n == len(first) and again.exact_n < rep1.exact_n // 2
    # a follow-up about another fact (after the answer) re-decodes rows, none of them exact before
    engine.slot.truncate(len(first))
    exact_before = set(range(len(first) - TAIL)) - set(engine.slot.record.approximated())
    follow = first + engine.tokenize("4729185.\n\nThanks. What is the locker code for the blue gate? ",
                                     add_special=False)
    skips.clear()
    rep2 = ridgefill_prefill(engine, follow, "guided", SPLIT, TAIL, maps=maps, reuse_prefix=True, guided=few)
    assert rep2.cache_n == len(first) and rep2.bulk_n == 0 and rep2.exact_n > 0, rep2.note
    # its rows skip the layers below the split: the row record kept the first prefill's split streams
    assert skips and all(skips)
    newly = set(range(len(first) - TAIL)) - set(engine.slot.record.approximated()) - exact_before
    assert len(newly) == rep2.exact_n
    gate_at = 300 + len(owl) + 800
    code = set(range(gate_at + len(gate) - 9, gate_at + len(gate) - 2))  # "1122334." after the key
    assert code & set(engine.slot.record.approximated()) == set()  # the asked value's rows are exact now
    assert code & newly  # and the follow-up made them so


def test_the_hit_rate_instrument_finds_the_asked_needle_and_resumes(engine, tmp_path, monkeypatch):
    from lab.evals import selection
    from backend.recall.haystacks import corpus_haystack
    from backend.recall.needles import build_item

    hay = corpus_haystack()
    bulk_item = build_item(engine, length=1536, depth=0.3, variant="single", haystack=hay)
    tail_item = build_item(engine, length=1536, depth=0.95, variant="single", haystack=hay)
    grid = selection.Grid(windows=(32,), layer_sets=((7,), (2,)), variants=(("max", "bulk+window"),),
                          pools=(5,), forwards=("wrap",), peaks=(6,))
    out = tmp_path / "hits.jsonl"
    recs = selection.run_hit_rate(engine, [bulk_item, tail_item], 12, 256, out, grid=grid)
    assert [r["bulk"] for r in recs] == [True, False]  # a needle in the exact tail is not scored
    hits = recs[0]["hits"]
    # layer 7 holds SmolLM2's retrieval heads, layer 2's ranking is poor
    # (docs/measurements/guided-design.md#selection-hit-rate-the-design-grid)
    for key in ("W32|L7|max|bulk+window|p5|fwrap|k6", "W32|L7|max|bulk+window|p5|fwrap|k6|contrast",
                "W32|L7|max|bulk+window|p5|fwrap|k6|contrast+own4"):
        p = GuidedParams()
        assert hits[key]["hit"] and 0 < hits[key]["rows"] <= p.budget + p.back + p.forward + 1  # the last place whole
    assert recs[0]["best_rank"]["W32|L7|max|bulk+window|p5|f-|k0"] < recs[0]["best_rank"]["W32|L2|max|bulk+window|p5|f-|k0"]
    assert engine.slot.record.approximated() == [] and others_empty(engine)
    # a second run reads the file instead of measuring again
    monkeypatch.setattr(selection, "item_hits", lambda *a, **k: (_ for _ in ()).throw(AssertionError("re-ran")))
    assert selection.run_hit_rate(engine, [bulk_item, tail_item], 12, 256, out, grid=grid) == recs


def test_a_run_made_exact_sees_the_runs_before_it_exact(model_path, monkeypatch):
    """Two runs that fit one batch cover the bulk but four rows: decoded together as they are, the
    second would see the first's approximate (zero-map) rows; with the batch's mask edited (run_mask),
    or decoded one after the other, it sees them exact, so its late-layer keys are (nearly) exact's."""
    from backend.engine import Engine, EngineConfig
    from backend.ridgefill import guided, redecode, run_mask
    from backend.ridgefill.redecode import Run
    from backend.ridgefill.runtime import runtime

    eng = Engine(EngineConfig(model_path, n_ctx=4096, n_batch=2048, n_ubatch=2048))  # one batch: both runs
    try:
        toks = induction_prompt(eng, 2000)
        eng.slot.prefill(toks, reuse_prefix=False)  # a fresh cache: row p in cell p
        ref = eng.last_logits()
        bulk = len(toks) - TAIL
        second = list(range(704, bulk))
        late = runtime(eng).layout.layers[25].k_cache
        exact_keys = late.rows()[second].astype(np.float32)

        def second_run_error():
            keys = late.rows()[eng.slot.record.cells(second)].astype(np.float32)
            return float(np.linalg.norm(keys - exact_keys) / np.linalg.norm(exact_keys))

        decodes = []
        decode_rows = eng.spares.decode_rows
        monkeypatch.setattr(eng.spares, "decode_rows",  # (first position, rows) of each call
                            lambda *a, **k: decodes.append((a[1][0], len(a[0]))) or decode_rows(*a, **k))
        monkeypatch.setattr(guided, "guided_runs", lambda *a, **k: [Run(0, 700), Run(704, bulk)])
        rep = ridgefill_prefill(eng, toks, "guided", SPLIT, TAIL, maps=ZeroMaps())
        assert rep.exact_n == bulk - 4 and eng.slot.record.approximated() == [700, 701, 702, 703]
        assert (0, bulk - 4) in decodes and (0, 700) not in decodes  # both runs in one llama_decode
        one_batch = second_run_error()
        assert kl(ref, eng.last_logits()) < 1e-2  # plumb's tolerance

        monkeypatch.setattr(run_mask, "supported", lambda cells: False)
        decodes.clear()
        ridgefill_prefill(eng, toks, "guided", SPLIT, TAIL, maps=ZeroMaps())
        assert (0, 700) in decodes and (704, bulk - 704) in decodes
        run_after_run = second_run_error()

        batched = redecode.redecode_exact
        monkeypatch.setattr(redecode, "redecode_exact", lambda *a, **k: batched(*a, **{**k, "chained": False}))
        ridgefill_prefill(eng, toks, "guided", SPLIT, TAIL, maps=ZeroMaps())
        together = second_run_error()
        # measured at layer 25: 0.022 run after run (layer 5, below the split, shows 0.009 from the
        # batch sizes alone), 0.30 with both runs in one batch as they are
        print(f"second run's layer-25 keys against exact's: {one_batch:.3f} in one batch with the mask "
              f"edited, {run_after_run:.3f} run after run, {together:.3f} in one batch as it is")
        assert one_batch < 0.1 and run_after_run < 0.1 < together
    finally:
        eng.close()


def test_a_cancelled_bulk_pass_keeps_only_rows_whose_late_layers_are_written(engine, monkeypatch):
    """Late K/V are written in blocks after the lower layers of several chunks: a cancel in between
    must not leave rows without them in the cache, where the next request would reuse them."""
    import pytest

    from backend.errors import Cancelled
    from backend.ridgefill import injection

    monkeypatch.setattr(injection, "LATE_BLOCK", 1000)  # written after every second 512-row chunk
    toks = induction_prompt(engine, 2000)
    maps = ZeroMaps()
    for chunks_done, kept in ((1, 0), (2, 1024)):
        events = []
        with pytest.raises(Cancelled):
            ridgefill_prefill(engine, toks, "speed", SPLIT, TAIL, maps=maps, on_event=events.append,
                              cancel=lambda: len(events) >= chunks_done)
        assert len(engine.slot.record) == kept and others_empty(engine)
    rep = ridgefill_prefill(engine, toks, "speed", SPLIT, TAIL, maps=maps, reuse_prefix=True)
    assert rep.cache_n == 1024 and rep.bulk_n == len(toks) - TAIL - 1024  # the written rows are reused


def test_rows_made_exact_on_an_engine_whose_ubatch_is_smaller_than_its_batch(model_path):
    """llama.cpp runs a decode of more than n_ubatch rows as several graphs; the cells of every row made
    exact must still be known (a follow-up scores them), so runs never outgrow one ubatch."""
    from backend.engine import Engine, EngineConfig

    eng = Engine(EngineConfig(model_path, n_ctx=2560, n_batch=1024, n_ubatch=256))
    try:
        ref, bulk, rep = exact_then_every_row_guided(eng, induction_prompt(eng, 2030))
        assert rep.exact_n == rep.bulk_n == bulk and eng.slot.record.approximated() == [], rep.note
        cells = eng.slot.record.cells(list(range(bulk)))
        assert min(cells) >= 0 and len(set(cells)) == bulk  # every row's own cell is known
        assert kl(ref, eng.last_logits()) < 1e-2
    finally:
        eng.close()


def test_rows_made_exact_skip_the_lower_layers_and_give_the_graph_its_ops_back(engine, monkeypatch):
    """The re-decode takes the bulk pass's split stream instead of running the layers below the split
    again: runs covering the bulk but four rows give exact's keys below the split (copied from the old
    cells) and above it, and exact's answer. Every parked node has its op back after each decode, as
    llama.cpp may reuse the graph for a next decode of the same shape."""
    from backend.ridgefill import ggml_graph, guided, redecode
    from backend.ridgefill.lower_skip import LowerLayersSkipped
    from backend.ridgefill.redecode import Run
    from backend.ridgefill.runtime import runtime

    toks = induction_prompt(engine, 2000)
    bulk = len(toks) - TAIL
    runs = [Run(0, bulk - 2 * TAIL - 4), Run(bulk - 2 * TAIL - 4, bulk - TAIL - 4), Run(bulk - TAIL, bulk)]
    assert all(0 < len(r) <= engine.ubatch_rows for r in runs)
    rows = [p for r in runs for p in range(r.start, r.end)]
    layers = runtime(engine).layout.layers
    engine.slot.prefill(toks, reuse_prefix=False)  # a fresh cache: row p in cell p
    ref = engine.last_logits()
    exact = {il: layers[il].k_cache.rows()[rows].astype(np.float32) for il in (5, 25)}

    skips = []

    class Recorded(LowerLayersSkipped):
        def restore(self):
            parked = list(self.parked)
            super().restore()  # the graph is still alive: llama.cpp keeps it for reuse
            given_back = all(ggml_graph.view(tensor).op == op != 0 for tensor, op in parked)
            skips.append((self.written, self.error, len(parked), given_back))

    monkeypatch.setattr(redecode, "LowerLayersSkipped", Recorded)
    monkeypatch.setattr(guided, "guided_runs", lambda *a, **k: runs)
    engine.slot.truncate(0)  # cleared to zeros: the new cells hold no old keys
    rep = ridgefill_prefill(engine, toks, "guided", SPLIT, TAIL, maps=ZeroMaps())
    assert rep.exact_n == len(rows) and len(skips) == len(runs)
    assert all(written and error is None and parked >= 10 * SPLIT and given_back
               for written, error, parked, given_back in skips)
    cells = engine.slot.record.cells(rows)
    errors = {il: float(np.linalg.norm(layers[il].k_cache.rows()[cells].astype(np.float32) - k) / np.linalg.norm(k))
              for il, k in exact.items()}
    # measured: 0.000 at layer 5 (the bulk pass's own keys: decoded again, 0.008 from the batch size
    # alone), 0.014 at layer 25 (the four approximate rows). Without the copy the cells hold zeros (1.09
    # at layer 5), without the stream written layer 25 is 0.87 off
    print(f"keys of the rows made exact against exact's: layer 5 {errors[5]:.4f}, layer 25 {errors[25]:.4f}; "
          f"{skips[0][2]} nodes parked; KL {kl(ref, engine.last_logits()):.4f}")
    assert errors[5] < 1e-3 and errors[25] < 0.1
    assert kl(ref, engine.last_logits()) < 1e-2  # plumb's tolerance


def test_a_prompt_that_nearly_fills_the_context_makes_fewer_rows_exact_and_runs(model_path):
    """guided's room cap (guided_runs): rows made exact take cells beside the bulk's until they replace them,
    so with fewer free cells than a ubatch the budget shrinks to what fits (an 8,000-token prompt in an
    8,192 context failed in llama_decode before the cap). Here a prompt a few dozen tokens short of a
    1,536-token context, the default budget of 512 rows and a 512-row ubatch."""
    from backend.engine import Engine, EngineConfig
    from backend.ridgefill.guided import DEFAULT

    tail = 64
    eng = Engine(EngineConfig(model_path, n_ctx=1536, n_batch=512, n_ubatch=512))
    try:
        toks = induction_prompt(eng, eng.n_ctx - 80)  # its question phrase brings it to ~60 short of n_ctx
        bulk = len(toks) - tail
        free = eng.n_ctx - bulk
        assert eng.n_ctx - 100 < len(toks) < eng.n_ctx - 16 and free < min(DEFAULT.budget, eng.ubatch_rows)
        rep = ridgefill_prefill(eng, toks, "guided", SPLIT, tail, maps=ZeroMaps())
        assert rep.mode == "guided" and not rep.note and 0 < rep.exact_n <= free, rep.note
        made_exact = sorted(set(range(bulk)) - set(eng.slot.record.approximated()))
        assert len(made_exact) == rep.exact_n
        cells = eng.slot.record.cells(made_exact)
        assert 0 <= min(cells) and max(cells) < eng.n_ctx and len(set(cells)) == len(made_exact)  # they fit
        assert seq_range(eng, 0) == (0, len(toks) - 1) and others_empty(eng)
        assert np.isfinite(eng.last_logits()).all()
    finally:
        eng.close()
