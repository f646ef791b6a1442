"""RidgeFill's runtime state for one engine, found once and reused by every request: the graph layout
(or why it was refused), the K/V (and scoring Q) weights, the window policy, and the verified
map sets. It hangs off the engine it was found on (`Engine.ridgefill`), which has one at most:
`runtime(engine)` makes it on first use and is the only writer of that slot.

Maps are loaded and verified (sha256 of every file, model fingerprint) once per split; later requests
reuse them until a map folder changes (a file's size or mtime, or which folders exist: stat calls
only), so no request hashes map files.
"""
from __future__ import annotations

import logging
import weakref
from pathlib import Path

from ..errors import RidgeFillError
from ..user_paths import data_dir
from ..window_policy import WindowPolicy, window_policy
from .cache_layout import GraphLayout, LayoutRefused, discover
from .departures import Departures
from .kv_writer import KVWriter

log = logging.getLogger(__name__)


def _windows(info, layout: GraphLayout) -> WindowPolicy:
    """The model's window policy: the GGUF's window, on the layers the graph shows writing to its cache."""
    caches = {il: (ll.k_index, ll.k_cache.kv_size) for il, ll in layout.layers.items()}
    return window_policy(info.n_layer, info.sliding_window, caches)


def _folder_stamp(dirs: list[Path], split: int) -> tuple:
    """What a map look-up for `split` depends on, from stat calls only: every folder of that split in
    the search dirs, and each file's size and mtime."""
    out = []
    for d in dirs:
        if not Path(d).is_dir():
            continue
        for sub in sorted(Path(d).iterdir()):
            if sub.is_dir() and sub.name.endswith(f"-s{split:02d}"):
                for f in sorted(sub.iterdir()):
                    st = f.stat()
                    out.append((str(f), st.st_size, st.st_mtime_ns))
    return tuple(out)


def _min_split(layout: GraphLayout) -> int:
    """The highest first layer of a cache group: a bulk pass cut below a group's first layer never sees
    that group's cell indices, and one cut at it reads them from the split layer's own K/V writes
    (gemma3's global layers start at 5, so S can be 5: bulk_tap.BulkTap)."""
    first: dict[str, int] = {}
    for il in sorted(layout.layers):
        first.setdefault(layout.layers[il].k_index, il)
    return max(1, max(first.values())) if first else 1


class RidgeFillRuntime:
    def __init__(self, engine):
        self.model_path = engine.info.path
        self.layout: GraphLayout | None = None
        self.refused: str | None = None
        self.writer: KVWriter | None = None
        self.windows = WindowPolicy(engine.info.n_layer)  # the layers that attend within a window: found once
        self.min_split = 1  # the lowest split RidgeFill can run at
        self.cells_read_from = 1  # the lowest split whose bulk pass reads every cache's cell indices itself
        # every row's sliding-window K/V stay, in the same cell in every cache (Engine.pin_seq)
        self.windows_kept = getattr(engine, "pin_seq", None) is not None
        self._maps: dict[int, tuple[tuple, object]] = {}  # split -> (folder stamp, RidgeMaps or the error)
        self._query_path = None
        self._n_head = engine.info.n_head
        self.departures = Departures(data_dir)  # documents the check sent to exact (departures.py)
        self.context_generation = getattr(engine, "context_generation", 0)  # the context the layout is of
        try:
            if not getattr(engine.config, "flash_attn", True):  # V would be transposed: the writes assume rows
                raise LayoutRefused("RidgeFill needs flash attention; this engine has it off (an exact baseline).")
            self.layout = discover(engine)
            self.windows = _windows(engine.info, self.layout)
            self.cells_read_from = _min_split(self.layout)
            # With every row in the same cell of every cache (windows_kept), a bulk pass cut below a
            # cache's first layer takes that cache's cells from the first one's (bulk_tap.BulkTap).
            self.min_split = 1 if self.windows_kept else self.cells_read_from
            # K/V weights of every layer that can be late, for any split (tens of MB for small models),
            # so a warm-up pays for the dequantization instead of the first request.
            self.writer = KVWriter(engine.info.path, self.layout, list(range(1, engine.info.n_layer)))
            # The fingerprint that map folders are checked against: parsing the GGUF header takes
            # seconds, which would otherwise land in the first speed request's TTFT.
            from .fingerprint import model_fingerprint

            model_fingerprint(engine.info.path)
        except RidgeFillError as exc:  # LayoutRefused, or K/V weights the write path cannot read
            self.refused = str(exc)
        except Exception as exc:  # anything unexpected about the graph: refuse, run exact
            log.exception("RidgeFill layout discovery failed")
            self.refused = f"RidgeFill is off: the graph could not be inspected ({type(exc).__name__}: {exc})."

    def rebind(self, engine) -> None:
        """The engine made a new context (it grew): find its caches again; weights and maps stay."""
        self.context_generation = engine.context_generation
        if self.refused is not None:
            return
        try:
            self.layout = discover(engine)
        except RidgeFillError as exc:
            self.refused = str(exc)
            return
        self.writer.layout = self.layout
        if self._query_path is not None:
            self._query_path.layout = self.layout

    def query_path(self, layers: list[int]):
        """The Q path of `layers` (guided scoring), loaded on first use and grown as needed."""
        from .query_path import QueryPath

        if self._query_path is None or not set(layers) <= set(self._query_path.weights):
            have = set(self._query_path.weights) if self._query_path else set()
            self._query_path = QueryPath(self.model_path, self.layout, sorted(have | set(layers)), self._n_head)
        return self._query_path

    def maps(self, split: int):
        """The verified RidgeMaps for `split`; raises MapsMissing / MapsRefused (cached the same way)."""
        from .map_store import default_map_dirs
        from .maps import MapsMissing, MapsRefused, find_maps

        dirs = default_map_dirs()
        stamp = _folder_stamp(dirs, split)
        hit = self._maps.get(split)
        if hit is None or hit[0] != stamp:
            try:
                found: object = find_maps(self.model_path, split, dirs)
            except (MapsMissing, MapsRefused) as exc:
                found = exc
            hit = self._maps[split] = (stamp, found)
        if isinstance(hit[1], Exception):
            raise hit[1]
        return hit[1]


def attach(engine) -> RidgeFillRuntime:
    """The engine built whole: its RidgeFill runtime made now (the discovery decode and the weights), and
    made again with every new context the engine makes (it grew), so planning a request never decodes.
    The app's engines are built so (app/commands/common.open_engine, the engine child)."""
    rt = runtime(engine)
    owner = weakref.ref(engine)  # the engine holds this callback: no cycle through it

    def rebind() -> None:
        built = owner()
        if built is not None:
            runtime(built)

    engine.on_new_context.append(rebind)
    return rt


def runtime(engine) -> RidgeFillRuntime:
    """The engine's RidgeFill runtime (attach made it; an engine made without attach, in tests and the
    lab, makes it on first use: a discovery decode and weight loading)."""
    rt = engine.ridgefill
    if rt is None:
        engine.ridgefill = rt = RidgeFillRuntime(engine)
    elif getattr(rt, "context_generation", 0) != getattr(engine, "context_generation", 0):
        rt.rebind(engine)
    return rt


def warm_up(engine, split: int | None = None) -> RidgeFillRuntime:
    """Pay RidgeFill's one-time costs before any request is timed: the runtime, guided mode's Q weights
    (paid by the first guided request otherwise: docs/measurements/guided-design.md#guided-warm-up), and the maps of
    `split` (the model's default split when None) loaded and verified, if there are any."""
    from .defaults import default_split
    from .guided import DEFAULT as GUIDED
    from .maps import MapsMissing, MapsRefused

    st = runtime(engine)
    if st.refused is None:
        split = default_split(engine.info) if split is None else split
        st.query_path(GUIDED.scoring_layers(engine.info.n_layer, split, st.windows.windowed))
        try:
            st.maps(split)
        except (MapsMissing, MapsRefused):
            pass  # a request will say so
    return st
