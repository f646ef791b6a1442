"""The engine is built whole (ridgefill.runtime.attach): RidgeFill's runtime is made with the context and
made again when the context grows, so planning a request never runs the discovery decode."""
from __future__ import annotations

from backend.engine import Engine, EngineConfig
from backend.protocol import AUTO_CTX, CompletionRequest
from backend.ridgefill import runtime as runtime_module
from backend.ridgefill.plan import plan_prefill
from backend.ridgefill.runtime import attach


def _grown_engine(model_path, built: bool) -> Engine:
    engine = Engine(EngineConfig(model_path, n_ctx=AUTO_CTX, n_batch=256, n_ubatch=256))
    if built:
        attach(engine)
    first = engine.n_ctx
    engine.make_room(first + 1000, 16)  # an automatic context grows: a new context, its cache gone
    assert engine.n_ctx > first
    return engine


def _plan_counting_discoveries(engine, monkeypatch) -> int:
    found = []
    real = runtime_module.discover
    monkeypatch.setattr(runtime_module, "discover", lambda e: found.append(1) or real(e))
    plan_prefill(engine, CompletionRequest(prompt="x", mode="speed"), engine.n_ctx - 64)
    return len(found)


def test_planning_on_a_built_engine_never_decodes_even_after_the_context_grew(model_path, monkeypatch):
    engine = _grown_engine(model_path, built=True)
    try:
        rt = engine.ridgefill
        assert rt is not None and rt.context_generation == engine.context_generation == 2
        assert rt.refused is None and rt.layout is not None
        assert _plan_counting_discoveries(engine, monkeypatch) == 0
    finally:
        engine.close()


def test_an_engine_made_without_attach_finds_its_layout_while_planning(model_path, monkeypatch):
    """What attach spares: the discovery decode inside the first request's planning."""
    engine = _grown_engine(model_path, built=False)
    try:
        assert engine.ridgefill is None
        assert _plan_counting_discoveries(engine, monkeypatch) == 1
    finally:
        engine.close()
