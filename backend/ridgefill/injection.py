"""Running a RidgeFill plan, in named steps: bulk chunks (layers below S in llama.cpp, the graph cut
there; late layers' K/V written from predicted (speed, quality, guided) or true (plumb) layer inputs),
then rows made exact again (quality, guided), then the exact tail.

The deciding is in plan.py (a plan.RidgeFillPlan is what runs here). `run_plan` never raises for a graph that turns out not to be as discovered:
it runs the exact prefill and says why in the report's `note`. Cancelled and EngineError propagate.
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
from . import ggml_graph
from .cache_layout import CellTap, LayoutRefused
from .ggml_graph import GGML_TYPE_F16, GGML_TYPE_F32, Node
from .stream_capture import capture_streams
from .lower_skip import SplitStreams
from .runtime import RidgeFillRuntime, runtime

log = logging.getLogger(__name__)


class _BulkTap(CellTap):
    """Eval hook for a bulk ubatch: reads each cache's cell indices and `l_out-(S-1)`, then stops the
    graph (yes to every later ask, no to every later 'go on', so further splits stop too). A cache
    first written by the split layer itself (Gemma 3's global cache at S = 5) has its cells read there:
    the graph goes on through that layer's K/V writes (its projections, not its attention) and stops.

    `windowed`: every attention below the split reads the sliding-window layers' mask, so a global layer
    there (Gemma 3's layer 5 at S = 6) attends to the window alone: its K/V stay exact, its output for
    bulk rows loses the far rows and costs what a sliding-window layer does
    (docs/LONG_DOCUMENTS.md#gemma-3-at-split-5-and-windowed-bulk-attention)."""

    def __init__(self, split: int, layout, windowed: bool = False):
        self.cut_name = f"l_out-{split - 1}".encode()
        super().__init__(layout)
        self.groups = set(self.cache_index.values())
        self.windowed = windowed

    def reset(self) -> None:
        super().reset()
        self.h: np.ndarray | None = None
        self.cut = False  # the split stream was read
        self.stopped = False  # the graph stops at the node asked for last
        self.window_mask: Node | None = None  # the first attention's mask (a sliding-window layer's)
        self.masks_windowed: set[int] = set()

    def _cells_complete(self) -> bool:
        return self.groups <= self.idx.keys()

    def wants(self, tensor: int) -> bool:
        if self.stopped:
            return True
        if self.read_cells(tensor) or self.cut:
            # past the cut, the cache write that completes the cells is the last node computed
            self.stopped = self.cut and self._cells_complete()
            return self.stopped
        if self.windowed and self.error is None:
            self._window_attention(tensor)
        return ggml_graph.view(tensor).name == self.cut_name

    def _window_attention(self, tensor: int) -> None:
        """An attention node asked for before anything is computed (no node below the cut is wanted): its
        mask, a graph input already set (F16 with flash attention), becomes a copy of the first
        attention's (never raises into C)."""
        src = _ATTENTION_MASK_SRC.get(ggml_graph.op_name(ggml_graph.view(tensor).op))
        if src is None:
            return
        try:
            mask = Node(tensor).src(src)
            if mask is not None and mask.op == "CPY":  # flash attention reads an F16 cast of the input
                mask = mask.src(0)
            dtype = _MASK_DTYPES.get(mask.type) if mask is not None and mask.op == "NONE" else None
            if dtype is None:
                raise ValueError("the attention's mask is not an F32 or F16 graph input")
            if self.window_mask is None:
                self.window_mask = mask
            elif mask.ptr != self.window_mask.ptr and mask.ptr not in self.masks_windowed:
                first = self.window_mask
                if (mask.ne, mask.nb, mask.type) != (first.ne, first.nb, first.type) or \
                        mask.nb[1] != mask.ne[0] * np.dtype(dtype).itemsize:
                    raise ValueError(f"masks differ ({mask.ne} vs {first.ne})")
                shape = (mask.ne[1] * mask.ne[2] * mask.ne[3], mask.ne[0])
                mask.array(dtype, shape)[:] = first.array(dtype, shape)
                self.masks_windowed.add(mask.ptr)
        except Exception as exc:
            self.error = f"windowed bulk attention: {exc}"

    def seen(self, tensor: int) -> bool:
        if self.stopped:
            return False
        t = ggml_graph.view(tensor)
        if t.name != self.cut_name:
            return True
        try:
            self.h = ggml_graph.Node(tensor).rows_f32()
        except Exception as exc:
            self.error = f"stream: {exc}"
        self.cut = True
        self.stopped = self._cells_complete() or self.error is not None
        return not self.stopped


_ATTENTION_MASK_SRC = {"FLASH_ATTN_EXT": 3, "SOFT_MAX": 1}  # op -> which src is the KQ mask
_MASK_DTYPES = {GGML_TYPE_F32: np.float32, GGML_TYPE_F16: np.float16}


class _Oracle:
    """plumb: the true late-layer inputs from an exact capture, served chunk by chunk."""

    def __init__(self, streams: dict[int, np.ndarray]):
        self.streams = streams

    def late_inputs(self, h_split: torch.Tensor, rows: slice) -> dict[int, torch.Tensor]:  # noqa: ARG002
        return {l: torch.from_numpy(np.ascontiguousarray(s[rows], dtype=np.float32)) for l, s in self.streams.items()}


class _Predictor:
    """speed, quality, guided: the ridge maps' predictions from the stream entering the split."""

    def __init__(self, maps):
        self.maps = maps

    def late_inputs(self, h_split: torch.Tensor, rows: slice) -> dict[int, torch.Tensor]:  # noqa: ARG002
        if hasattr(self.maps, "predict_all"):
            return self.maps.predict_all(h_split)
        return {l: self.maps.predict(l, h_split) for l in self.maps.layers}


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
    gathered into few large blocks, take the engine's threads (_write_late)."""
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
            return _run(engine, plan, tokens, reuse_prefix, on_event, cancel)
        except LayoutRefused as exc:
            # Something about this graph is not as discovered: never reuse these rows, and run exact.
            log.warning("RidgeFill refused mid-prefill: %s", exc)
            engine.slot.truncate(0)
            return ExactPrefill(f"RidgeFill stopped ({exc}); ran exact.").run(
                engine, tokens, reuse_prefix=False, on_event=on_event, cancel=cancel)


def _run(engine, plan, tokens, reuse_prefix, on_event, cancel) -> PrefillReport:
    rt = runtime(engine)
    report = PrefillReport(mode=plan.mode, split=plan.split, tail=plan.tail, note=plan.note,
                           warnings=list(plan.warnings))
    phases = _Phases("capture", "lower", "predict", "write")
    t0 = time.perf_counter()
    bulk_end = bulk_rows(engine, len(tokens), plan.tail, plan.mode)
    slot = engine.slot
    if plan.mode == "plumb":
        slot.truncate(0)
        with phases("capture"):
            source = _oracle(engine, tokens[:bulk_end], plan.split, cancel)
        start = 0
    else:
        source = _Predictor(plan.maps)
        start = slot.reusable_prefix(tokens, plan.tag) if reuse_prefix else 0
        slot.truncate(start)
    report.cache_n = start
    report.bulk_n = bulk_pass(engine, plan, tokens, start, bulk_end, source, phases, on_event=on_event, cancel=cancel,
                              t0=t0)
    pos = max(start, bulk_end)
    if plan.mode in ("quality", "guided"):
        streams = SplitStreams(rt.layout, plan.split, slot.record)
        report.exact_n = _make_rows_exact(engine, rt, plan, tokens, bulk_end, phases, cancel, streams)
    with phases("tail"):
        chunk_n = engine.ubatch_rows
        # the tail's cells are recorded too (one ubatch a chunk): the answer's sources score every row's key
        slot.prefill_chunks(tokens, pos, chunk_n=chunk_n, t0=t0, on_event=on_event, cancel=cancel, stage="tail",
                            hook=CellTap(rt.layout))
    report.prompt_ms = (time.perf_counter() - t0) * 1000
    report.breakdown_ms = phases.rounded()
    return report


def prefill_bulk(engine, plan, tokens: list[int]) -> None:
    """Sequence 0 becomes `tokens` through `plan`'s bulk pass alone (no row made exact, no tail): what a
    run of a longer prompt starting with them writes there (backend/recall/prefix_snapshot.py saves it)."""
    engine.slot.truncate(0)
    with one_torch_thread():
        bulk_pass(engine, plan, tokens, 0, len(tokens), _Predictor(plan.maps))


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
    """Rows [start, bulk_end) chunk by chunk through the bulk path (sequence 0 must hold `start` rows),
    late inputs from `source` (None with plan.write_late False); returns the rows done. Raises
    Cancelled between chunks, with the cache holding only rows whose late layers are written. The
    streams entering the split stay with the rows written (quality, guided, a follow-up and the idle
    refinement skip the lower layers with them, and write the sliding windows they need)."""
    rt = runtime(engine)
    phases = phases or _Phases()
    t0 = time.perf_counter() if t0 is None else t0
    tap = _BulkTap(plan.split, rt.layout, windowed=plan.window_bulk)
    chunk_n = engine.ubatch_rows
    swa_from = rt.windows.first_window_row(bulk_end)
    pending = _LateRows(start)
    pos = start
    try:
        while pos < bulk_end:
            if cancel is not None and cancel():
                raise Cancelled(f"prefill cancelled after {pending.start} of {len(tokens)} tokens")
            n = min(chunk_n, bulk_end - pos)
            _lower_chunk(engine, rt, plan, tokens, pos, n, tap, phases, pending)
            pos += n
            if plan.write_late and (len(pending) >= LATE_BLOCK or pos == bulk_end):
                _write_late(engine, rt, plan, pending, source, phases, swa_from)
                pending = _LateRows(pos)
            if on_event is not None:
                on_event(ProgressEvent(pos, len(tokens), (time.perf_counter() - t0) * 1000, stage="bulk"))
    except BaseException:
        if plan.write_late:
            engine.slot.truncate(pending.start)  # rows without their late K/V must not be reused
        raise
    return max(0, pos - start)


def _oracle(engine, bulk: list[int], split: int, cancel) -> _Oracle:
    """plumb's source: the exact model's streams entering every late layer (float32: a float16 stream
    alone costs ~5e-4 relative error in every K/V row)."""
    late = list(range(split + 1, engine.info.n_layer))
    return _Oracle(capture_streams(engine, [bulk], late, cancel=cancel, dtype=np.float32) if late else {})


def _lower_chunk(engine, rt: RidgeFillRuntime, plan, tokens, pos: int, n: int, tap: _BulkTap,
                 phases: _Phases, pending: _LateRows) -> None:
    """Rows [pos, pos + n) through the layers below the split in llama.cpp (the graph stops there);
    their split stream and cache cells join `pending`."""
    with phases("lower"):
        tap.reset()
        engine.slot.decode(tokens[pos : pos + n], pos, approx_tag=plan.tag or "plumb", hook=tap)
    if tap.error or tap.h is None or tap.h.shape[0] != n:
        raise LayoutRefused(f"bulk pass: {tap.error or 'the split stream was not seen'}")
    if not plan.write_late:
        return
    if rt.windows_kept and len({c.tobytes() for c in tap.idx.values()}) > 1:
        raise LayoutRefused("the sliding-window and the global caches put a row in different cells")
    for il in range(plan.split, engine.info.n_layer):
        ll = rt.layout.layers[il]
        for name in (ll.k_index, ll.v_index):
            if len(tap.idx.get(name, ())) != n:
                raise LayoutRefused(f"cell indices of layer {il}'s cache were not seen below the split")
    pending.add(tap.h, dict(tap.idx))


def _write_late(engine, rt: RidgeFillRuntime, plan, pending: _LateRows, source, phases: _Phases,
                swa_from: int) -> None:
    """Every late layer's K/V for the `pending` rows, written from the late inputs `source` gives for
    them, on all the engine's threads; the rows keep their streams entering the split."""
    h = torch.from_numpy(np.concatenate(pending.h))
    n, pos = len(h), pending.start
    cells = {name: np.concatenate(parts) for name, parts in pending.cells.items()}
    with torch_threads(engine.config.n_threads):
        with phases("predict"):
            inputs = source.late_inputs(h, slice(pos, pos + n))
            inputs[plan.split] = h
        with phases("write"):
            engine.slot.write_late(_late_writes(engine, rt, plan, inputs, pos, n, cells, swa_from),
                                   split=plan.split, start=pos, streams=h.numpy())


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
                                    cells[ll.v_index][rows])


def _make_rows_exact(engine, rt: RidgeFillRuntime, plan, tokens, bulk_end: int,
                     phases: _Phases, cancel, streams: SplitStreams | None) -> int:
    """quality: rows chosen by token class; guided: rows the question attends to at layers below the
    split. Only rows not exact yet are decoded again (a follow-up re-decodes what its question adds);
    those whose split stream a bulk pass kept (this prefill's or, for a follow-up, an earlier one's) skip
    the layers below the split (`streams`)."""
    from .quality_rows import select_runs
    from .redecode import redecode_exact, runs_of

    if plan.mode == "quality":
        with phases("select"):
            chosen = select_runs(engine, tokens, 0, bulk_end, plan.share)
    else:
        from .guided import guided_runs

        chosen = guided_runs(engine, rt, plan, tokens, bulk_end, phases, plan.guided)  # probe, score
    todo = set(engine.slot.record.approximated(0, bulk_end))
    runs = runs_of([p for r in chosen for p in range(r.start, r.end) if p in todo], engine.ubatch_rows)
    if rt.windows.has_windows and runs:
        with phases("windows"):
            _write_windows(engine, rt, plan, runs, bulk_end)
    with phases("exact_rows"):
        # guided: each run sees the runs before it exact, else the answer takes a rival needle's value
        # (docs/measurements/guided-design.md#runs-made-exact-in-order). One batch whose mask shows each run the new
        # rows of the runs before it (run_mask) computes what a llama_decode per run would, with the
        # tiled attention kernel (docs/measurements/guided-design.md#one-call-re-decode).
        n = redecode_exact(engine, tokens, runs, cancel=cancel, cells=CellTap(rt.layout),
                           chained=plan.mode == "guided", streams=streams)
        return n


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
            il, h if il == plan.split else plan.maps.predict(il, h), positions, cells, cells))
