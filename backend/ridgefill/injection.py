"""RidgeFill prefill: bulk rows run layers 0..S-1 in llama.cpp and stop there; late layers' K/V for
those rows are written from predicted (speed) or true (plumb) layer inputs; the tail runs exact.

`ridgefill_prefill` never raises for a refused RidgeFill (layout, maps, too short a prompt): it runs the
exact prefill and says why in the report's `note`. Cancelled and EngineError propagate.
"""
from __future__ import annotations

import logging
import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from ..errors import RidgeFillError
from ..protocol import ProgressEvent
from . import ggml_graph
from .cache_layout import GraphLayout, LayoutRefused, discover, read_index
from .capture import capture_streams
from .defaults import MIN_BULK, MIN_TAIL
from .kv_writer import KVWriter

log = logging.getLogger(__name__)

MODES = ("speed", "plumb", "quality")


@dataclass
class PrefillReport:
    mode: str  # the mode that ran: "off" when RidgeFill was refused
    split: int | None
    tail: int | None
    bulk_n: int = 0
    exact_n: int = 0  # quality: bulk rows made exact again
    cache_n: int = 0
    prompt_ms: float = 0.0
    breakdown_ms: dict = field(default_factory=dict)  # lower, predict, write, (exact_rows,) tail (+ capture for plumb)
    note: str = ""
    warnings: list[str] = field(default_factory=list)


class _EngineState:
    """Per-engine facts found once: the graph layout (or why it was refused) and K/V weights."""

    def __init__(self):
        self.layout: GraphLayout | None = None
        self.refused: str | None = None
        self.writer: KVWriter | None = None
        self.writer_layers: tuple[int, ...] = ()
        self.n_swa: int = 0
        self.swa_layers: set[int] = set()


_STATES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _sliding_window(model_path: str) -> int:
    from ..model_file import open_reader
    from pathlib import Path

    reader = open_reader(Path(model_path))
    arch = str(reader.fields["general.architecture"].contents())
    f = reader.fields.get(f"{arch}.attention.sliding_window")
    return int(f.contents()) if f is not None else 0


def _swa_layers(info, layout: GraphLayout, n_swa: int) -> set[int]:
    """Sliding-window layers, whose bulk rows outside the tail's window are never read again.

    gemma3: llama.cpp makes every 6th layer global (set_swa_pattern(6)). Taken only when the graph
    agrees: the global and the sliding layers write through two different cell-index inputs."""
    if info.architecture != "gemma3" or n_swa <= 0:
        return set()
    swa = {il for il in layout.layers if il % 6 != 5}
    glob = set(layout.layers) - swa
    swa_groups = {layout.layers[il].k_index for il in swa}
    glob_groups = {layout.layers[il].k_index for il in glob}
    if len(swa_groups) == 1 and len(glob_groups) == 1 and swa_groups != glob_groups:
        return swa
    return set()


def engine_state(engine) -> _EngineState:
    st = _STATES.get(engine)
    if st is None:
        st = _EngineState()
        try:
            st.layout = discover(engine)
            st.n_swa = _sliding_window(engine.info.path)
            st.swa_layers = _swa_layers(engine.info, st.layout, st.n_swa)
            # K/V weights of every layer that can be late, for any split (tens of MB for small models),
            # so a warm-up pays for the dequantization instead of the first request.
            _writer(engine, st, list(range(1, engine.info.n_layer)))
            # The fingerprint that map folders are checked against: parsing the GGUF header takes
            # seconds, which would otherwise land in the first speed request's TTFT.
            from .fingerprint import model_fingerprint

            model_fingerprint(engine.info.path)
        except RidgeFillError as exc:  # LayoutRefused, or K/V weights the write path cannot read
            st.refused = str(exc)
        except Exception as exc:  # anything unexpected about the graph: refuse, run exact
            log.exception("RidgeFill layout discovery failed")
            st.refused = f"RidgeFill is off: the graph could not be inspected ({type(exc).__name__}: {exc})."
        _STATES[engine] = st
    return st


def _writer(engine, st: _EngineState, layers: list[int]) -> KVWriter:
    if st.writer is None or not set(layers) <= set(st.writer_layers):
        st.writer = KVWriter(engine.info.path, st.layout, layers)
        st.writer_layers = tuple(layers)
    return st.writer


class _BulkTap:
    """Eval hook for a bulk ubatch: reads each cache's cell indices (at ask time, as graph inputs are
    set before compute), reads `l_out-(S-1)`, then stops the graph (yes to every later ask, no to every
    later 'go on', so further splits stop too)."""

    def __init__(self, split: int, cache_index: dict[str, str], set_rows_op: int):
        self.cut_name = f"l_out-{split - 1}".encode()
        self.cache_index = cache_index
        self.set_rows_op = set_rows_op
        self.reset()

    def reset(self) -> None:
        self.h: np.ndarray | None = None
        self.idx: dict[str, np.ndarray] = {}
        self.cut = False
        self.error: str | None = None

    def wants(self, tensor: int) -> bool:
        if self.cut:
            return True
        t = ggml_graph.view(tensor)
        if t.op == self.set_rows_op:
            try:
                node = ggml_graph.Node(tensor)
                group = self.cache_index.get(node.src(2).root().name)
                if group is not None and group not in self.idx:
                    self.idx[group] = read_index(node.src(1))
            except Exception as exc:  # never raise into C
                self.error = f"cell indices: {exc}"
            return False
        return t.name == self.cut_name

    def seen(self, tensor: int) -> bool:
        if self.cut:
            return False
        t = ggml_graph.view(tensor)
        if t.name != self.cut_name:
            return True
        try:
            self.h = ggml_graph.Node(tensor).rows_f32()
        except Exception as exc:
            self.error = f"stream: {exc}"
        self.cut = True
        return False


class _Oracle:
    """plumb: the true late-layer inputs from an exact capture, served chunk by chunk."""

    def __init__(self, streams: dict[int, np.ndarray]):
        self.streams = streams

    def late_inputs(self, h_split: torch.Tensor, rows: slice) -> dict[int, torch.Tensor]:  # noqa: ARG002
        return {l: torch.from_numpy(np.ascontiguousarray(s[rows], dtype=np.float32)) for l, s in self.streams.items()}


class _Predictor:
    """speed: the ridge maps' predictions from the stream entering the split."""

    def __init__(self, maps):
        self.maps = maps

    def late_inputs(self, h_split: torch.Tensor, rows: slice) -> dict[int, torch.Tensor]:  # noqa: ARG002
        if hasattr(self.maps, "predict_all"):
            return self.maps.predict_all(h_split)
        return {l: self.maps.predict(l, h_split) for l in self.maps.layers}


def _exact(engine, tokens, report: PrefillReport, note: str, reuse_prefix: bool, on_event, cancel) -> PrefillReport:
    cache_n, ms = engine.prefill(tokens, reuse_prefix=reuse_prefix, on_event=on_event, cancel=cancel)
    report.mode, report.cache_n, report.prompt_ms, report.bulk_n = "off", cache_n, ms, 0
    report.note = note
    return report


def bulk_rows(engine, n_tokens: int, tail: int, mode: str = "speed") -> int:
    """Rows that take the RidgeFill path: those with at least `tail` rows after them.

    `plumb` rounds them down to whole prefill chunks, so bulk and tail fall into the same ubatches as an
    exact prefill (llama.cpp's kernels round differently for a tiny ubatch: a 3-row ubatch moved the
    stream at layer 1 by 1%), which makes plumb equal off row for row; its tail is T to T + chunk - 1
    rows. `speed` and `quality` take every such row, so the tail is exactly T: a rounded-down bulk left
    up to 1,023 rows in an 8K prompt's tail, each costing the full model (measured 34.5 s instead of
    about 32 s at 8,000 tokens, S=15)."""
    n = max(0, n_tokens - tail)
    if mode == "plumb":
        chunk = min(engine.config.n_batch, engine.config.n_ubatch)
        return n // chunk * chunk
    return n


def refusal(engine, n_tokens: int, mode: str, split: int, tail: int) -> str | None:
    """Why RidgeFill cannot run on this request (None when it can), before any maps are looked up."""
    if mode not in MODES:
        return f"unknown mode {mode!r}"
    L = engine.info.n_layer
    if not 0 < split < L:
        return f"split {split} is outside 1..{L - 1} for this {L}-layer model: ran exact."
    if tail < MIN_TAIL:
        return f"tail {tail} is below the minimum {MIN_TAIL}: ran exact."
    bulk = bulk_rows(engine, n_tokens, tail, mode)
    if bulk < MIN_BULK:
        return (f"the prompt has {bulk:,} rows before the {tail}-token exact tail, fewer than "
                f"{MIN_BULK:,}: nothing to win, ran exact.")
    st = engine_state(engine)
    if st.refused:
        return st.refused
    return None


@contextmanager
def one_torch_thread():
    """The torch work per chunk is small; with several threads its OpenMP workers spin and fight
    llama.cpp's threads for the cores (measured 30× slower on a busy 2-core machine)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def ridgefill_prefill(engine, tokens, mode, split, tail, maps=None, cancel=None, on_event=None, **kw) -> "PrefillReport":
    """Prefill `tokens` with RidgeFill. Leaves the last token's logits ready, like Engine.prefill.

    `maps` (speed, quality): a RidgeMaps; None looks them up with find_maps. Keywords: `write_late=False`
    skips the late-layer writes (a control that must differ from exact); `reuse_prefix=True` (speed,
    quality) reuses a cached prefix when it is exact or was written the same way; `share` (quality): the
    share of bulk rows made exact again (default selected_rows.DEFAULT_SHARE)."""
    with one_torch_thread():
        return _prefill(engine, tokens, mode, split, tail, maps, cancel, on_event, **kw)


def _prefill(
    engine,
    tokens: list[int],
    mode: str,
    split: int,
    tail: int,
    maps=None,
    cancel: Callable[[], bool] | None = None,
    on_event: Callable[[object], None] | None = None,
    *,
    reuse_prefix: bool = False,
    write_late: bool = True,
    share: float | None = None,
) -> PrefillReport:
    from .selected_rows import DEFAULT_SHARE

    report = PrefillReport(mode=mode, split=split, tail=tail)
    why = refusal(engine, len(tokens), mode, split, tail)
    if why:
        return _exact(engine, tokens, report, why, reuse_prefix, on_event, cancel)
    st = engine_state(engine)
    share = DEFAULT_SHARE if share is None else share
    if mode == "quality" and st.swa_layers:
        # A row decoded again deep in the prompt would find its sliding-window history already evicted.
        report.mode = mode = "speed"
        report.note = "quality mode needs a model without sliding-window layers: ran speed."
    L = engine.info.n_layer
    late = list(range(split, L))
    t0 = time.perf_counter()
    bd = {"capture": 0.0, "lower": 0.0, "predict": 0.0, "write": 0.0, "tail": 0.0}
    bulk_end = bulk_rows(engine, len(tokens), tail, mode)

    if mode == "plumb":
        tag = None
        start = 0
        engine.truncate_cache(0)
        # float32: a float16 stream alone costs ~5e-4 relative error in every K/V row.
        streams = (capture_streams(engine, [tokens[:bulk_end]], late[1:], cancel=cancel, dtype=np.float32)
                   if late[1:] else {})
        source = _Oracle(streams)
        bd["capture"] = (time.perf_counter() - t0) * 1000
    else:  # speed; quality makes selected rows exact after the speed pass
        if maps is None:
            from .maps import MapsMissing, MapsRefused, find_maps

            try:
                maps = find_maps(engine.info.path, split)
            except (MapsMissing, MapsRefused) as exc:
                return _exact(engine, tokens, report, f"RidgeFill maps unavailable ({exc}); ran exact.",
                              reuse_prefix, on_event, cancel)
        if getattr(maps, "split", split) != split or set(maps.layers) != set(late[1:]):
            return _exact(engine, tokens, report,
                          f"the maps are for split {getattr(maps, 'split', '?')} and layers {list(maps.layers)[:1]}.., "
                          f"not split {split}: ran exact.", reuse_prefix, on_event, cancel)
        report.warnings = list(getattr(maps, "warnings", []) or [])
        source = _Predictor(maps)
        tag = f"s{split}:{getattr(maps, 'folder', id(maps))}" + (f":q{share}" if mode == "quality" else "")
        start = 0
        if reuse_prefix and (engine.kv_exact or getattr(engine, "kv_tag", None) == tag):
            start = engine.reusable_prefix(tokens, exact_only=False)
        engine.truncate_cache(start)
        if start >= bulk_end:  # everything approximable is cached already: finish exact
            report.cache_n = start
            report.bulk_n = 0
    writer = _writer(engine, st, late)
    layout = st.layout
    swa_from = bulk_end - st.n_swa if st.n_swa else None
    tap = _BulkTap(split, layout.cache_index(), layout.set_rows_op)
    chunk_n = min(engine.config.n_batch, engine.config.n_ubatch)
    engine.kv_exact = False  # from the first bulk decode on, the cache holds approximated rows
    engine.kv_tag = tag
    report.cache_n = start
    pos = start
    prev_hook = engine.eval_hook
    try:
        while pos < bulk_end:
            if cancel is not None and cancel():
                from ..errors import Cancelled

                raise Cancelled(f"prefill cancelled after {pos} of {len(tokens)} tokens")
            chunk = tokens[pos : min(pos + chunk_n, bulk_end)]
            n = len(chunk)
            ta = time.perf_counter()
            tap.reset()
            engine.eval_hook = tap
            try:
                engine.decode(chunk, pos, logits_last=False)
            finally:
                engine.eval_hook = prev_hook
            engine.kv_tokens.extend(chunk)
            tb = time.perf_counter()
            bd["lower"] += (tb - ta) * 1000
            if tap.error or tap.h is None or tap.h.shape[0] != n:
                raise LayoutRefused(f"bulk pass: {tap.error or 'the split stream was not seen'}")
            h = torch.from_numpy(tap.h)
            inputs = source.late_inputs(h, slice(pos, pos + n))
            inputs[split] = h
            tc = time.perf_counter()
            bd["predict"] += (tc - tb) * 1000
            if write_late:
                positions = torch.arange(pos, pos + n)
                for il in late:
                    ll = layout.layers[il]
                    k_idx, v_idx = tap.idx.get(ll.k_index), tap.idx.get(ll.v_index)
                    if k_idx is None or v_idx is None or len(k_idx) != n or len(v_idx) != n:
                        raise LayoutRefused(f"cell indices of layer {il}'s cache were not seen below the split")
                    rows = slice(None)
                    if swa_from is not None and il in st.swa_layers:
                        # A sliding-window layer: only rows inside the tail's window are ever read again.
                        first = max(0, swa_from - pos)
                        if first >= n:
                            continue
                        rows = slice(first, n)
                    writer.write(il, inputs[il][rows], positions[rows], k_idx[rows], v_idx[rows])
            bd["write"] += (time.perf_counter() - tc) * 1000
            pos += n
            report.bulk_n += n
            if on_event is not None:
                on_event(ProgressEvent(pos, len(tokens), (time.perf_counter() - t0) * 1000, stage="bulk"))
        if mode == "quality" and report.bulk_n:
            from .selected_rows import redecode_exact, select_runs

            tq = time.perf_counter()
            runs = select_runs(engine, tokens, start, bulk_end, share)
            engine.kv_tag = None  # until every selected row is exact, no quality request may reuse these
            report.exact_n = redecode_exact(engine, tokens, runs, cancel=cancel)
            engine.kv_tag = tag
            bd["exact_rows"] = (time.perf_counter() - tq) * 1000
        tt = time.perf_counter()
        engine.decode_exact(tokens, pos, chunk_n=chunk_n, t0=t0, on_event=on_event, cancel=cancel, stage="tail")
        bd["tail"] = (time.perf_counter() - tt) * 1000
    except LayoutRefused as exc:
        # Something about this graph is not as discovered: never reuse these rows, and run exact.
        log.warning("RidgeFill refused mid-prefill: %s", exc)
        engine.eval_hook = prev_hook
        engine.truncate_cache(0)
        return _exact(engine, tokens, report, f"RidgeFill stopped ({exc}); ran exact.", False, on_event, cancel)
    report.prompt_ms = (time.perf_counter() - t0) * 1000
    report.breakdown_ms = {k: round(v, 1) for k, v in bd.items()}
    return report
