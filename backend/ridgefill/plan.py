"""The one place that decides how a request is prefilled: `plan_prefill`.

It answers what will run (exact, speed, quality, guided or plumb), with which split, tail and maps, and
why a requested mode is not what runs. Everything else executes a plan: the Engine runs whatever
strategy it is given (`ExactPrefill`, or a `RidgeFillPlan` whose `run` is injection.run_plan); a plan
is frozen, and nothing changes it once decided.
Deciding reads only the engine's `info`, `ubatch_rows` and RidgeFill runtime (runtime.runtime), so a
fake engine with those three can be planned for (tests/test_ridgefill_plan.py).
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

from ..prefill import ExactPrefill, PrefillReport
from ..protocol import MODEL_DEFAULT, RIDGEFILL_MODES, CompletionRequest
from .defaults import (MIN_BULK, MIN_TAIL, default_mode, default_note, exact_default_note, mode_that_runs,
                       split_or_default, tail_or_default, window_bulk_or_default)
from .cache_layout import CellTap
from .departures import document_key
from .guided import GuidedParams
from .injection import bulk_rows, run_plan
from .runtime import runtime


# RidgeFill with layers offloaded reads and writes the device's tensors through ggml's backend API
# (ggml_graph.Node.read/write); until the GPU check (packaging/gpu_check) has measured it, it runs only when
# this is "1" (docs/USAGE.md#a-gpu).
ON_GPU_ENV = "RIDGEFILL_ON_GPU"


@dataclass(frozen=True)
class RidgeFillPlan:
    """A decided RidgeFill prefill; frozen: nothing changes it after planning."""

    mode: str  # speed | quality | guided | plumb: what will run
    split: int
    tail: int
    maps: object | None = None  # RidgeMaps (or any object with split/layers/predict); None for plumb
    tag: str | None = None  # how this plan's approximated rows are written (prefix reuse compares it)
    note: str = ""  # why the mode differs from the one asked for, or that its split is a guess
    warnings: tuple[str, ...] = ()
    share: float | None = None  # quality: share of bulk rows made exact
    guided: GuidedParams = GuidedParams()  # guided: how the question's attention picks rows
    write_late: bool = True  # False: a control that skips late-layer writes (must differ from exact)
    window_bulk: bool = False  # bulk rows' attentions below the split see the sliding window only
    # The strategy's parts a plan may hand in (the lab's variants are plans, never patches):
    inputs: Callable | None = None  # makes the late inputs' source (late_inputs.source_for); None: maps/plumb's
    kv: Callable | None = None  # kv(writer, il, h, pos) -> (K, V) of a late layer; None: its own projections

    def run(self, engine, tokens, *, reuse_prefix, on_event, cancel) -> PrefillReport:
        return run_plan(engine, self, tokens, reuse_prefix=reuse_prefix, on_event=on_event, cancel=cancel)


def refusal(engine, n_tokens: int, mode: str, split: int, tail: int) -> str | None:
    """Why RidgeFill cannot run on this request (None when it can), before any maps are looked up."""
    if mode not in RIDGEFILL_MODES:
        return f"unknown mode {mode!r}: ran exact."
    L = engine.info.n_layer
    if not 0 < split < L:
        return f"split {split} is outside 1..{L - 1} for this {L}-layer model: ran exact."
    if tail < MIN_TAIL:
        return f"tail {tail} is below the minimum {MIN_TAIL}: ran exact."
    bulk = bulk_rows(engine, n_tokens, tail, mode)
    if bulk < MIN_BULK:
        return (f"the prompt has {bulk:,} rows before the {tail}-token exact tail, fewer than "
                f"{MIN_BULK:,}: nothing to win, ran exact.")
    if getattr(engine, "n_gpu_layers", 0) and os.environ.get(ON_GPU_ENV) != "1":
        return (f"{engine.n_gpu_layers} layers are on the GPU, where RidgeFill's path (ggml's backend API) is "
                f"not measured yet: ran exact ({ON_GPU_ENV}=1 tries it; --gpu-layers none runs RidgeFill on the CPU).")
    rt = runtime(engine)
    if rt.refused is None and split < rt.min_split:
        return (f"split {split} is below layer {rt.min_split}, the first layer of its own K/V cache (a "
                f"global layer of this sliding-window model): the bulk pass would not see where that cache's "
                f"rows go. Use a split of at least {rt.min_split}: ran exact.")
    return rt.refused


def plan_ridgefill(engine, n_tokens: int, mode: str, split: int, tail: int, *, maps=None,
                   share: float | None = None, guided: GuidedParams | None = None,
                   write_late: bool = True, window_bulk: bool = False) -> RidgeFillPlan | ExactPrefill:
    """A RidgeFill plan for a prompt of `n_tokens`, or ExactPrefill with the reason it cannot run.
    `maps` None: the verified maps for this model and split (loaded once, see runtime.py). `window_bulk`:
    the bulk pass's attentions below the split see the sliding window only (a model whose layer 0 is a
    sliding-window layer; elsewhere ignored, and the note says so)."""
    why = refusal(engine, n_tokens, mode, split, tail)
    if why:
        return ExactPrefill(why)
    rt = runtime(engine)
    note = ""
    runs = mode_that_runs(mode, windows_evicted=rt.windows.has_windows and not rt.windows_kept)
    if runs != mode:
        note = (f"{mode} mode needs every row's sliding window kept, and this engine runs without a "
                f"full-size sliding-window cache: ran {runs}.")
        mode = runs
    if window_bulk and not rt.windows.is_windowed(0):
        note = (note + " " if note else "") + "windowed bulk attention needs sliding-window layers: ran full."
        window_bulk = False
    if mode == "plumb":
        return RidgeFillPlan("plumb", split, tail, write_late=write_late, window_bulk=window_bulk)
    if maps is None:
        from .maps import MapsMissing, MapsRefused

        try:
            maps = rt.maps(split)
        except (MapsMissing, MapsRefused) as exc:
            return ExactPrefill(f"RidgeFill maps unavailable ({exc}); ran exact.")
    late = set(range(split + 1, engine.info.n_layer))
    if getattr(maps, "split", split) != split or set(maps.layers) != late:
        return ExactPrefill(f"the maps are for split {getattr(maps, 'split', '?')} and layers "
                            f"{list(maps.layers)[:1]}.., not split {split}: ran exact.")
    tag = f"s{split}{'w' if window_bulk else ''}:{getattr(maps, 'folder', id(maps))}"
    return RidgeFillPlan(mode, split, tail, maps=maps, tag=tag, note=note,
                         warnings=tuple(getattr(maps, "warnings", []) or ()), share=share,
                         guided=guided or GuidedParams(), write_late=write_late, window_bulk=window_bulk)


def cell_recorder(engine):
    """What makes the eval hook that records each row's cell in an exact prefill (RidgeFill's passes
    record their own), so the answer's sources can read the rows' keys; None where the layout is unknown."""
    rt = runtime(engine)
    return None if rt.refused is not None else partial(CellTap, rt.layout)


def plan_prefill(engine, request: CompletionRequest, n_tokens: int) -> RidgeFillPlan | ExactPrefill:
    """How to prefill `request` (a prompt of `n_tokens`): the Engine's planner. A request with documents
    has its exact rows' cells recorded (backend/sources.py reads the keys there)."""
    plan = _plan_prefill(engine, request, n_tokens)
    if request.documents and isinstance(plan, ExactPrefill):
        plan = replace(plan, cells=cell_recorder(engine))
    return plan


def _plan_prefill(engine, request: CompletionRequest, n_tokens: int) -> RidgeFillPlan | ExactPrefill:
    if request.mode == "off":
        return ExactPrefill()
    mode = default_mode(engine.info) if request.mode == MODEL_DEFAULT else request.mode
    if mode == "off":  # tune (here, or the measured table) chose exact for this model
        return ExactPrefill(exact_default_note(engine.info))
    split = split_or_default(engine.info, request.split)
    tail = tail_or_default(engine.info, request.tail)
    window = window_bulk_or_default(engine.info, split, request.window_bulk)
    plan = plan_ridgefill(engine, n_tokens, mode, split, tail, share=request.quality_share, window_bulk=window)
    if request.split is None and isinstance(plan, RidgeFillPlan):  # a default that was never measured, or departs
        plan = replace(plan, note=" ".join(n for n in (plan.note, default_note(engine.info)) if n))
    return _guarded(engine, request, plan)


def _guarded(engine, request: CompletionRequest, plan):
    """Exact, and why, for a document on which the check corrected a RidgeFill answer (departures.py)."""
    departures = getattr(runtime(engine), "departures", None)
    if not (request.documents and isinstance(plan, RidgeFillPlan) and plan.maps is not None and departures):
        return plan
    key = document_key(engine.info.path, plan.split, getattr(plan.maps, "folder", ""), request.documents)
    why = departures.why(key)
    return plan if why is None else ExactPrefill(why)


def ridgefill_prefill(engine, tokens, mode, split, tail, maps=None, cancel=None, on_event=None, *,
                      reuse_prefix: bool = False, write_late: bool = True, share: float | None = None,
                      guided=None, window_bulk: bool = False) -> PrefillReport:
    """Plan and run a RidgeFill prefill of `tokens` (evals and tests; requests go through plan_prefill).
    Leaves the last token's logits ready, like Engine.prefill.

    `maps` None: the verified maps for this model and split. `write_late=False` skips the late-layer
    writes (a control that must differ from exact); `reuse_prefix` reuses a cached prefix that is exact
    or written the same way; `share` (quality): the share of bulk rows made exact again; `guided`: a
    guided.GuidedParams."""
    plan = plan_ridgefill(engine, len(tokens), mode, split, tail, maps=maps, share=share, guided=guided,
                          write_late=write_late, window_bulk=window_bulk)
    return plan.run(engine, tokens, reuse_prefix=reuse_prefix, on_event=on_event, cancel=cancel)
