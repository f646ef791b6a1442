"""Running a RidgeFill plan: `prefill`, read top to bottom, calls the method's steps in order: the bulk
rows' layers below S in llama.cpp (`lower_layers`, the graph cut there), their late layers' inputs
(`predict`: the maps', or plumb's true ones), those layers' K/V written (`write_late`, through the slot),
the rows to make exact chosen (`choose_rows`: quality, guided) and decoded again (`redecode`), then
the exact tail (`tail`). Each decode's eval hook is made in one place (`_Prefill.hook`).

The deciding is in plan.py (a frozen plan.RidgeFillPlan is what runs here). `run_plan` never raises for
a graph that turns out not to be as discovered: it runs the exact prefill and says why in the report's
`note`. Cancelled and EngineError propagate.
"""
from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch

from ..prefill import ExactPrefill, PrefillReport
from ..errors import Cancelled
from ..protocol import ProgressEvent
from .bulk_tap import BulkTap
from .cache_layout import CellTap, LayoutRefused
from .late_inputs import source_for
from .lower_skip import SplitStreams
from .runtime import RidgeFillRuntime, runtime

log = logging.getLogger(__name__)


class _Phases:
    """Milliseconds per named phase of one prefill."""

    def __init__(self, *names: str):
        self.ms = {n: 0.0 for n in names}

    @contextmanager
    def __call__(self, name: str):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.ms[name] = self.ms.get(name, 0.0) + (time.perf_counter() - t) * 1000

    def rounded(self) -> dict:
        return {k: round(v, 1) for k, v in self.ms.items()}


@contextmanager
def torch_threads(n_threads: int):
    n = torch.get_num_threads()
    torch.set_num_threads(max(1, n_threads))
    try:
        yield
    finally:
        torch.set_num_threads(n)


def one_torch_thread():
    """Torch work between llama.cpp calls runs on one thread: with several, its OpenMP workers spin and
    fight llama.cpp's threads for the cores
    (docs/measurements/speed.md#injection-torch-threads-and-activation-quantization). The late writes,
    gathered into few large blocks, take the engine's threads (predict, write_late)."""
    return torch_threads(1)


def bulk_rows(engine, n_tokens: int, tail: int, mode: str = "speed") -> int:
    """Rows that take the RidgeFill path: those with at least `tail` rows after them.

    `plumb` rounds them down to whole prefill chunks, so bulk and tail fall into the same ubatches as an
    exact prefill (llama.cpp's kernels round differently for a tiny ubatch: a 3-row ubatch moved the
    stream at layer 1 by 1%), which makes plumb equal off row for row; its tail is T to T + chunk - 1
    rows. The other modes take every such row, so the tail is exactly T: a rounded-down bulk left
    up to 1,023 rows in an 8K prompt's tail, each costing the full model
    (docs/measurements/split-tail-tune.md#tail-of-exactly-t-rows)."""
    n = max(0, n_tokens - tail)
    if mode == "plumb":
        chunk = engine.ubatch_rows
        return n // chunk * chunk
    return n


def run_plan(engine, plan, tokens: list[int], *, reuse_prefix: bool, on_event, cancel) -> PrefillReport:
    with one_torch_thread():
        try:
            return prefill(engine, plan, tokens, reuse_prefix, on_event, cancel)
        except LayoutRefused as exc:
            # Something about this graph is not as discovered: never reuse these rows, and run exact.
            log.warning("RidgeFill refused mid-prefill: %s", exc)
            engine.slot.truncate(0)
            return ExactPrefill(f"RidgeFill stopped ({exc}); ran exact.").run(
                engine, tokens, reuse_prefix=False, on_event=on_event, cancel=cancel)


def prefill(engine, plan, tokens: list[int], reuse_prefix: bool, on_event, cancel) -> PrefillReport:
    """RidgeFill's prefill, the method's steps in order (RIDGEFILL.md, "The method"): the bulk rows through
    the layers below the split, their late layers' inputs predicted and those layers' K/V written (a
    block of rows at a time), the rows to make exact chosen and decoded again, then the exact tail."""
    run = _Prefill(engine, plan, tokens, bulk_rows(engine, len(tokens), plan.tail, plan.mode),
                   on_event=on_event, cancel=cancel, phases=_Phases("capture", "lower", "predict", "write"))
    report = PrefillReport(mode=plan.mode, split=plan.split, tail=plan.tail, note=plan.note,
                           warnings=list(plan.warnings))
    report.cache_n = start = begin(run, reuse_prefix)  # rows reused; plumb: none, the true inputs captured
    report.bulk_n = bulk_steps(run, start)  # lower layers, late inputs predicted, late K/V written
    runs = choose_rows(run)  # quality: by token class; guided: rows the question attends to
    write_windows(run, runs)  # the late sliding-window K/V the chosen rows attend to
    report.exact_n = redecode(run, runs)  # the chosen rows through every layer, in place of theirs
    tail(run, max(start, run.bulk_end))  # the last rows exactly
    report.prompt_ms = (time.perf_counter() - run.t0) * 1000
    report.breakdown_ms = run.phases.rounded()
    return report


class _Prefill:
    """One RidgeFill prefill as its steps pass it on: the engine, its slot and runtime, the plan, the
    prompt and where its bulk ends, the phases' times, where the late layers' inputs come from (`source`),
    the rows lowered so far (`pos`) and those whose late K/V are written (`written`). Each decode's eval
    hook is made here (`hook`)."""

    def __init__(self, engine, plan, tokens: list[int], bulk_end: int, *, on_event=None, cancel=None,
                 t0: float | None = None, phases: _Phases | None = None, source=None):
        self.engine, self.slot, self.rt, self.plan, self.tokens = engine, engine.slot, runtime(engine), plan, tokens
        self.bulk_end, self.on_event, self.cancel = bulk_end, on_event, cancel
        self.t0 = time.perf_counter() if t0 is None else t0
        self.phases = phases or _Phases()
        self.source = source
        self.pos = self.written = 0

    def hook(self, decode: str):
        """The eval hook of a decode: `lower` (a bulk chunk: its cells and split stream, the graph cut
        there), else one that records the rows' cells (the tail, the rows decoded again)."""
        if decode == "lower":
            return BulkTap(self.plan.split, self.rt.layout, windowed=self.plan.window_bulk,
                           shared_cells=self.plan.split < self.rt.cells_read_from)
        return CellTap(self.rt.layout)

    def drop_unwritten(self) -> None:
        """Rows without their late K/V must not be reused: the cache keeps only those written."""
        if self.plan.write_late:
            self.slot.truncate(self.written)


def begin(run: _Prefill, reuse_prefix: bool) -> int:
    """Sequence 0 holds the rows this prefill starts after (a reused prefix written the same way, or none),
    and `run.source` gives the late inputs (late_inputs.source_for: the maps' predictions, plumb's true
    streams, captured, or the plan's own)."""
    engine, plan, slot = run.engine, run.plan, run.slot
    start = slot.reusable_prefix(run.tokens, plan.tag) if reuse_prefix and plan.mode != "plumb" else 0
    slot.truncate(start)
    with run.phases("capture"):
        run.source = source_for(engine, plan, run.tokens[: run.bulk_end], start, run.cancel)
    slot.truncate(start)  # a source that captured decoded on sequence 0
    return start


def prefill_bulk(engine, plan, tokens: list[int]) -> None:
    """Sequence 0 becomes `tokens` through `plan`'s bulk pass alone (no row made exact, no tail): what a
    run of a longer prompt starting with them writes there (evals/prefix_snapshot.py saves it)."""
    engine.slot.truncate(0)
    with one_torch_thread():
        source = source_for(engine, plan, tokens, 0)
        engine.slot.truncate(0)
        bulk_pass(engine, plan, tokens, 0, len(tokens), source)


# Late-layer K/V are written for this many bulk rows at a time, with all the engine's threads, after
# their lower layers ran: fewer, larger blocks let torch use both cores without its threads spinning
# against llama.cpp's between every chunk (docs/measurements/speed.md#late-kv-in-2048-row-blocks).
LATE_BLOCK = 2048


@dataclass
class _LateRows:
    """Bulk rows decoded below the split whose late-layer K/V are not written yet: the stream entering
    the split and, per cache tensor, the cell of each row."""
    start: int
    h: list[np.ndarray] = field(default_factory=list)
    cells: dict[str, list[np.ndarray]] = field(default_factory=dict)

    def __len__(self) -> int:
        return sum(len(h) for h in self.h)

    def add(self, h: np.ndarray, idx: dict[str, np.ndarray]) -> None:
        self.h.append(h)
        for name, cells in idx.items():
            self.cells.setdefault(name, []).append(cells)


def bulk_pass(engine, plan, tokens: list[int], start: int, bulk_end: int, source,
              phases: _Phases | None = None, *, on_event=None, cancel=None, t0: float | None = None) -> int:
    """The bulk steps alone (prefill's first three): rows [start, bulk_end) chunk by chunk
    (sequence 0 must hold `start` rows), late inputs from `source` (None with plan.write_late False);
    returns the rows done. Raises Cancelled between chunks, with the cache holding only rows whose late
    layers are written."""
    run = _Prefill(engine, plan, tokens, bulk_end, on_event=on_event, cancel=cancel, t0=t0, phases=phases,
                   source=source)
    return bulk_steps(run, start)


def bulk_steps(run: _Prefill, start: int) -> int:
    """The method's first three steps for rows [start, bulk_end), a block at a time: llama.cpp below the
    split (the graph cut there), each late layer's input from the stream entering the split, those layers'
    K/V written into the rows' cells. Returns the rows done; on any exception (Cancelled between chunks)
    the cache keeps only rows whose late layers are written."""
    try:
        for block in lower_layers(run, start):
            write_late(run, block, predict(run, block))
    except BaseException:
        run.drop_unwritten()
        raise
    return max(0, run.pos - start)


def lower_layers(run: _Prefill, start: int):
    """Rows [start, bulk_end) through the layers below the split in llama.cpp, chunk by chunk (the graph
    stops there); yields them LATE_BLOCK rows at a time (their split streams and cells) when the plan
    writes late K/V. Progress after each chunk; Cancelled between chunks. The streams entering the split
    stay with the rows written (quality, guided, a follow-up and the idle refinement skip the lower
    layers with them, and write the sliding windows they need)."""
    engine, plan, tokens = run.engine, run.plan, run.tokens
    tap, chunk_n = run.hook("lower"), engine.ubatch_rows
    run.pos = run.written = start
    pending = _LateRows(start)
    while run.pos < run.bulk_end:
        if run.cancel is not None and run.cancel():
            raise Cancelled(f"prefill cancelled after {run.written} of {len(tokens)} tokens")
        pos, n = run.pos, min(chunk_n, run.bulk_end - run.pos)
        with run.phases("lower"):
            tap.reset()
            run.slot.decode(tokens[pos : pos + n], pos, approx_tag=plan.tag or "plumb", hook=tap)
        _check_tap(run, tap, n)
        run.pos += n
        if plan.write_late:
            pending.add(tap.h, dict(tap.idx))
            if len(pending) >= LATE_BLOCK or run.pos == run.bulk_end:
                yield pending
                pending = _LateRows(run.pos)
        if run.on_event is not None:
            run.on_event(ProgressEvent(run.pos, len(tokens), (time.perf_counter() - run.t0) * 1000, stage="bulk"))


def _check_tap(run: _Prefill, tap: BulkTap, n: int) -> None:
    """LayoutRefused unless the bulk tap saw the chunk's split stream and (to write late K/V) every late
    layer's cells, one cell per row in every cache."""
    if tap.error or tap.h is None or tap.h.shape[0] != n:
        raise LayoutRefused(f"bulk pass: {tap.error or 'the split stream was not seen'}")
    if not run.plan.write_late:
        return
    if run.rt.windows_kept and len({c.tobytes() for c in tap.idx.values()}) > 1:
        raise LayoutRefused("the sliding-window and the global caches put a row in different cells")
    for il in range(run.plan.split, run.engine.info.n_layer):
        ll = run.rt.layout.layers[il]
        for name in (ll.k_index, ll.v_index):
            if len(tap.idx.get(name, ())) != n:
                raise LayoutRefused(f"cell indices of layer {il}'s cache were not seen below the split")


def predict(run: _Prefill, block: _LateRows) -> dict[int, torch.Tensor]:
    """Each late layer's input for the block's rows, from `run.source` (the maps, or plumb's captured
    streams); the split layer's is the stream itself. On all the engine's threads."""
    h = torch.from_numpy(np.concatenate(block.h))
    with torch_threads(run.engine.config.n_threads), run.phases("predict"):
        inputs = run.source.late_inputs(h, slice(block.start, block.start + len(h)))
        inputs[run.plan.split] = h
    return inputs


def write_late(run: _Prefill, block: _LateRows, inputs: dict[int, torch.Tensor]) -> None:
    """Every late layer's K/V for the block's rows, from their `inputs`, written by the slot into their
    cells on all the engine's threads; the rows keep their streams entering the split."""
    h, pos, n = inputs[run.plan.split], block.start, len(block)
    cells = {name: np.concatenate(parts) for name, parts in block.cells.items()}
    swa_from = run.rt.windows.first_window_row(run.bulk_end)
    with torch_threads(run.engine.config.n_threads), run.phases("write"):
        run.slot.write_late(_late_writes(run.engine, run.rt, run.plan, inputs, pos, n, cells, swa_from),
                            split=run.plan.split, start=pos, streams=h.numpy())
    run.written = pos + n


def choose_rows(run: _Prefill):
    """quality: rows chosen by token class; guided: rows the question attends to at layers below the
    split (the probe). Only rows not exact yet, merged into runs of at most a ubatch; None in the other
    modes."""
    from .quality_rows import select_runs
    from .redecode import runs_of

    engine, plan, bulk_end = run.engine, run.plan, run.bulk_end
    if plan.mode == "quality":
        with run.phases("select"):
            chosen = select_runs(engine, run.tokens, 0, bulk_end, plan.share)
    elif plan.mode == "guided":
        from . import guided

        chosen = guided.guided_runs(engine, run.rt, plan, run.tokens, bulk_end, run.phases, plan.guided)
    else:
        return None
    todo = set(run.slot.record.approximated(0, bulk_end))
    return runs_of([p for r in chosen for p in range(r.start, r.end) if p in todo], engine.ubatch_rows)


def write_windows(run: _Prefill, runs) -> None:
    """On a sliding-window model, the late sliding-window K/V of the rows in each chosen run's window."""
    if run.rt.windows.has_windows and runs:
        with run.phases("windows"):
            _write_windows(run.engine, run.rt, run.plan, runs, run.bulk_end)


def redecode(run: _Prefill, runs) -> int:
    """The chosen runs decoded again through every layer (llama.cpp) in place of their approximated
    rows, the layers below the split skipped with the kept streams; the rows made exact. Only rows not
    exact yet are decoded again (a follow-up re-decodes what its question adds)."""
    if runs is None:
        return 0
    from . import redecode as rd

    streams = SplitStreams(run.rt.layout, run.plan.split, run.slot.record)
    with run.phases("exact_rows"):
        # guided: each run sees the runs before it exact, else the answer takes a rival needle's value
        # (docs/measurements/guided-design.md#runs-made-exact-in-order). One batch whose mask shows each run the new
        # rows of the runs before it (run_mask) computes what a llama_decode per run would, with the
        # tiled attention kernel (docs/measurements/guided-design.md#one-call-re-decode).
        return rd.redecode_exact(run.engine, run.tokens, runs, cancel=run.cancel, cells=run.hook("redecode"),
                                 chained=run.plan.mode == "guided", streams=streams)


def tail(run: _Prefill, pos: int) -> None:
    """Rows pos.. exactly, one ubatch a chunk, their cells recorded: the answer's sources score every
    row's key."""
    with run.phases("tail"):
        run.slot.prefill(run.tokens, pos, chunk_n=run.engine.ubatch_rows, t0=run.t0, on_event=run.on_event,
                         cancel=run.cancel, stage="tail", hook=run.hook("tail"))


def _late_writes(engine, rt: RidgeFillRuntime, plan, inputs, pos: int, n: int, cells, swa_from: int):
    """The late layers' K/V writes of rows [pos, pos + n), one layer at a time."""
    positions = torch.arange(pos, pos + n)
    for il in range(plan.split, engine.info.n_layer):
        ll = rt.layout.layers[il]
        rows = slice(None)
        if rt.windows.is_windowed(il):
            # A sliding-window layer: only rows inside the tail's window are ever read again.
            first = max(0, swa_from - pos)
            if first >= n:
                continue
            rows = slice(first, n)
        yield from rt.writer.writes(il, inputs[il][rows], positions[rows], cells[ll.k_index][rows],
                                    cells[ll.v_index][rows], compute=plan.kv)


def _write_windows(engine, rt: RidgeFillRuntime, plan, runs, bulk_end: int) -> None:
    """The late sliding-window layers' K/V of the approximated rows in each run's window, which the bulk
    pass left unwritten (only the tail reads a window there): a row decoded again attends to them.
    Written from the kept split streams' predictions, so writing a row twice writes the same values."""
    swa_from = rt.windows.first_window_row(bulk_end)  # from here on the bulk pass wrote them
    record = engine.slot.record
    approx = set(record.approximated(0, max(0, swa_from)))
    window = rt.windows.window
    rows = sorted({q for r in runs for q in range(max(0, r.start - window + 1), r.start) if q in approx})
    if not rows:
        return
    h = record.split_streams(plan.split, rows)
    if h is None:
        raise LayoutRefused("a row in a re-decoded run's window has no kept split stream")
    h = torch.from_numpy(np.ascontiguousarray(h, dtype=np.float32))
    positions = torch.tensor(rows)
    cells = np.asarray(record.cells(rows))
    late_swa = sorted(il for il in rt.windows.windowed if il >= plan.split)
    with torch_threads(engine.config.n_threads):
        engine.slot.write_late(w for il in late_swa for w in rt.writer.writes(
            il, h if il == plan.split else plan.maps.predict(il, h), positions, cells, cells, compute=plan.kv))
