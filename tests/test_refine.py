"""Refinement in idle time: approximated rows made exact in prompt order, a chunk at a time, the rows
with a kept split stream through the layers from the split on only; stopped between chunks.

Zero maps make approximated rows obvious: after speed mode the next token's logits are far from
exact's, after refinement within plumb's tolerance."""
from __future__ import annotations

import pytest

from backend.ridgefill import lower_skip, redecode, refine_context
from backend.ridgefill.plan import ridgefill_prefill
from backend.ridgefill.refine import Refinement
from test_quality_mode import SPLIT, ZeroMaps
from test_ridgefill_injection import engine, induction_prompt, kl  # noqa: F401 - the module's engine fixture

TAIL = 64


def speed_after_exact(engine, n_doc: int):
    """(exact's last logits, the prompt) with the prompt then prefilled in speed mode on zero maps."""
    toks = induction_prompt(engine, n_doc)
    engine.slot.prefill(toks, reuse_prefix=False)
    ref = engine.last_logits()
    rep = ridgefill_prefill(engine, toks, "speed", SPLIT, TAIL, maps=ZeroMaps())
    assert rep.mode == "speed" and engine.slot.record.approximated(), rep.note
    assert kl(ref, engine.last_logits()) > 0.1  # the control: the approximated rows show
    return ref, toks


def test_refinement_makes_every_row_exact_and_then_matches_exact(engine, monkeypatch):
    ref, toks = speed_after_exact(engine, 1300)
    skipped = []
    real = lower_skip.LowerLayersSkipped

    def counted(inner, split, stream):
        skipped.append(len(stream))
        return real(inner, split, stream)

    monkeypatch.setattr(redecode, "LowerLayersSkipped", counted)
    monkeypatch.setattr(refine_context, "LowerLayersSkipped", counted)
    cells_before = engine.slot.record.cells(list(range(len(toks) - TAIL)))
    refine = Refinement(engine)
    assert refine.refusal() is None and not refine.done
    refine.run()
    # the bulk rows were refined in refinement's own context and copied into their cells
    assert engine.slot.record.cells(list(range(len(toks) - TAIL))) == cells_before
    assert refine._context is None  # closed once every row is exact
    assert refine.done and engine.slot.record.approximated() == [] and engine.slot.record.n_clean == len(toks)
    assert engine.slot.record.with_cells() == list(range(len(toks)))  # guided can score every row again
    assert sum(skipped) == len(toks) - TAIL  # the bulk rows ran from the split on; the tail through every layer
    assert max(refine.step_s) > 0 and len(refine.step_s) > 2
    cache_n, _ = engine.slot.prefill(toks)  # a request now reuses every row, as an exact one
    assert cache_n == len(toks) - 1
    assert kl(ref, engine.last_logits()) < 1e-2  # plumb's tolerance (see test_ridgefill_injection)


def test_a_request_during_refinement_stops_it_at_a_chunk_boundary_and_reuses_what_is_exact(engine):
    _, toks = speed_after_exact(engine, 1300)
    refine = Refinement(engine)
    stopped = refine.run(should_stop=lambda: len(refine.step_s) >= 2)  # "a task arrived" after two chunks
    assert len(refine.step_s) == 2 and 0 < stopped == engine.slot.record.n_clean < len(toks) and not refine.done
    clean = engine.slot.record.n_clean
    # the new request (an exact question about the first part) reuses the rows made exact so far
    cache_n, _ = engine.slot.prefill(toks[: clean + 40])
    assert cache_n == clean
    refine.run()  # and refinement goes on from the record's first unclean row
    assert refine.done


def test_a_clean_prefix_the_own_context_lacks_is_decoded_there_again_or_refined_in_place(engine, monkeypatch):
    """Refinement's own context lost (closed, as when a task changed the document): a short clean prefix
    is decoded there again exactly (SEED_MAX_ROWS), a longer one refined in sequence 0's cache; either
    way the cache comes back to exact's."""
    import numpy as np

    from backend.ridgefill.runtime import runtime

    toks = induction_prompt(engine, 1300)
    engine.slot.prefill(toks, reuse_prefix=False)  # into an empty cache: row p in cell p
    ref = engine.last_logits()
    top = runtime(engine).layout.layers[engine.info.n_layer - 1]
    exact_k = top.k_cache.rows()[: len(toks)].astype(np.float32)
    ridgefill_prefill(engine, toks, "speed", SPLIT, TAIL, maps=ZeroMaps())
    bulk = list(range(len(toks) - TAIL))

    def k_error(rows=bulk) -> float:  # the top layer's K of bulk rows against exact's
        return float(np.abs(top.k_cache.rows()[engine.slot.record.cells(rows)] - exact_k[rows]).max())

    assert k_error() > 5.0  # the control: zero maps wrote them
    where = []
    real = lower_skip.LowerLayersSkipped

    def counted(module):
        def hook(inner, split, stream):
            where.append(module.__name__)
            return real(inner, split, stream)
        return hook

    for module in (redecode, refine_context):
        monkeypatch.setattr(module, "LowerLayersSkipped", counted(module))
    refine = Refinement(engine)
    first = refine.step()
    assert first == refine_context.SEED_MAX_ROWS == engine.ubatch_rows
    refine.close()
    refine.step()  # 512 clean rows: decoded again in a new own context
    refine.close()
    refine.step()  # 1,024: refined in place
    assert where == [refine_context.__name__, refine_context.__name__, redecode.__name__]
    refine.run()
    # every bulk row's late K is exact's, whichever way it was refined (in place: 0.11 of rounding, the
    # cells and batches differ; a wrong prefix in the own context: 2.95)
    assert k_error() < 0.5
    engine.slot.prefill(toks)
    assert kl(ref, engine.last_logits()) < 1e-2


def test_rows_guided_made_exact_are_decoded_again_in_order(engine):
    """A guided prefill leaves exact rows that saw approximated history: refinement redoes them too."""
    from backend.ridgefill.guided import GuidedParams

    ref, toks = speed_after_exact(engine, 1300)
    rep = ridgefill_prefill(engine, toks, "guided", SPLIT, TAIL, maps=ZeroMaps(), reuse_prefix=True,
                            guided=GuidedParams(budget=64))
    assert rep.mode == "guided" and rep.exact_n > 0, rep.note
    Refinement(engine).run()
    engine.slot.prefill(toks)
    assert kl(ref, engine.last_logits()) < 1e-2


def test_refinement_on_a_sliding_window_model_comes_back_to_exact(tmp_path):
    """gemma3 (a 64-row window): with every window kept (Engine.pin_seq), rows decoded again in order see
    their exact windows, so the refined cache gives exact's logits (F32 tiny model)."""
    import numpy as np

    from backend.engine import Engine, EngineConfig
    from test_quality_mode import Zero
    from tiny_gguf import write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "tiny-gemma3.gguf", "gemma3", n_layer=12)
    toks = [1] + [int(t) for t in np.random.default_rng(4).integers(3, 299, 1400)]
    with Engine(EngineConfig(str(path), n_ctx=2048, n_threads=2)) as e:
        e.slot.prefill(toks, reuse_prefix=False)
        ref = e.last_logits()
        ridgefill_prefill(e, toks, "speed", 7, TAIL, maps=Zero(7, 12))
        approximated = np.abs(ref - e.last_logits()).max()
        assert approximated > 0.1  # the control: the approximated rows show
        refine = Refinement(e)
        assert refine.refusal() is None
        refine.run()
        assert refine.done and e.slot.record.approximated() == []
        assert e.slot.prefill(toks)[0] == len(toks) - 1
        # exact's within rounding: the late layers ran in 64-row chunks, exact's in 512-row ones
        assert np.abs(ref - e.last_logits()).max() < approximated / 20


def test_a_task_arriving_inside_a_chunk_stops_its_decode_and_leaves_the_rows_as_they_were(engine):
    """Preemption inside a chunk (llama.cpp's abort callback): Preempted, sequence 0 and the row record as
    before the chunk, no spare sequence holding a cell; refinement then goes on to exact."""
    import llama_cpp

    from backend.errors import Preempted

    ref, toks = speed_after_exact(engine, 1300)
    refine = Refinement(engine)
    refine.step()  # one whole chunk first: the stopped one starts deeper in the prompt
    before = (engine.slot.record.n_clean, engine.slot.record.approximated(), engine.slot.record.with_cells())
    asked = []

    def task_arrived() -> bool:  # asked every ABORT_POLL_S inside the decode; "yes" on the third time
        asked.append(1)
        return len(asked) >= 3

    with pytest.raises(Preempted):
        refine.step(abort=task_arrived)
    assert len(asked) == 3  # stopped inside the decode, not before it
    after = (engine.slot.record.n_clean, engine.slot.record.approximated(), engine.slot.record.with_cells())
    assert after == before
    mem = llama_cpp.llama_get_memory(engine.context.handle)
    assert llama_cpp.llama_memory_seq_pos_max(mem, 0) == len(toks) - 1
    assert all(llama_cpp.llama_memory_seq_pos_max(mem, s) == -1 for s in engine.spares.ids)
    refine.run()  # the stopped chunk is done again, and no abort check is left on the context
    engine.slot.prefill(toks)
    assert kl(ref, engine.last_logits()) < 1e-2


def test_refinements_own_context_shares_the_model_and_closes_with_the_engine(model_path):
    """The refinement context is a sibling engine on the same loaded model (no second copy of the
    weights), one sequence; closing the engine closes it first (the model it uses is freed after)."""
    from backend.engine import Engine, EngineConfig

    main = Engine(EngineConfig(model_path, n_ctx=1024, n_threads=2))
    other = main.sibling(1024, swa_full=False)
    assert other._model == main._model and other.n_seq == 1 and not other._owns_model
    toks = main.tokenize("The sibling decodes on its own cache.")
    other.slot.decode(toks, 0, logits_last=True)  # its own slot: sequence 0 of its own context
    main.slot.prefill(toks, reuse_prefix=False)
    assert kl(main.last_logits(), other.last_logits()) < 1e-4  # the same model, the same rows
    main.close()
    assert other.context is None and other._model is None


def test_the_own_context_is_not_reused_for_a_lower_split_than_its_rows_were_refined_from(engine):
    """A chunk refined there skipped the layers below its split: a chunk at a lower split would attend
    to those layers' unwritten K/V, so the clean prefix is decoded there again (or refined in place)."""
    ref, toks = speed_after_exact(engine, 1300)
    refine = Refinement(engine)
    refine.step()  # rows 0..511, refined in the own context from SPLIT
    ctx = refine._context
    assert ctx.exact_from == SPLIT and ctx.hold_prefix(512, SPLIT)  # the same split: kept as it is
    assert ctx.hold_prefix(512, SPLIT - 2) and ctx.exact_from == 0  # a lower one: decoded again, exactly
    refine.run()
    engine.slot.prefill(toks)
    assert kl(ref, engine.last_logits()) < 1e-2
