"""Default mode, split S and exact tail T per model.

Split: in `speed` mode recall falls off a cliff below a model-specific layer (a per-row map cannot
recreate what a late layer's attention brings in from other rows), so a default must come from
measurement, never from "half the layers" (docs/measurements/recall.md#recall-cliff). `guided` mode (the
default) makes the rows the question attends to exact, which moved SmolLM2's split down to 12 on needles
(docs/measurements/split-tail-tune.md#split-s--12-not-9); real questions about real documents lost answers there that
S = 18 keeps (docs/measurements/real-questions.md#real-questions-about-real-documents), so 18 is its default. On Gemma 3 (sliding-window layers) guided keeps every row's
window (EngineConfig.swa_full) and scores at a global layer at or below the split, which lets Gemma 3
270M run at S = 5, its first global layer: fast, but layer 11's predicted keys move exact's replies
there, so its default is S = 11, which computes them; at S = 11 guided's rows no longer pay for what they
cost a follow-up, so it runs `speed` (MEASURED_MODES).
Other models: two thirds of the layers (above both measured cliffs, as a share), until a sweep says more.
A model tuned on this machine (`python -m app tune`, backend/tuning/tune.py) has its split measured:
the tuned record beside the maps (backend/ridgefill/tuned.py) wins over both.

Tail: the reference uses T = 2,048 (minimum 512) on a GPU. On a CPU with a small model the tail runs the
full model exactly and costs about as much per row as the work RidgeFill saves. With the question's rows
made exact, the tail can be short: T = 64 (the question, its chat frame and a few dozen document rows)
keeps guided's recall, and the 8,000-token speed target needs it (docs/measurements/split-tail-tune.md#exact-tail-t--64).
Gemma 3 keeps 512: it equals its sliding window, so its sliding-window layers need (almost) no
bulk K/V.
"""
from __future__ import annotations

import math

# The RidgeFill mode the app runs when RidgeFill is on, unless MEASURED_MODES says otherwise for the model
# (docs/measurements/recall.md#recall-of-guided-at-the-defaults)
DEFAULT_MODE = "guided"

MIN_BULK = 1024  # fewer bulk rows than this: nothing to win, run exact
# guided mode makes the rows the question needs exact, so the tail can be shorter than speed's 512; 64
# is the shortest measured (the probe's window of 32 rows must lie inside it):
# docs/measurements/split-tail-tune.md#exact-tail-t--64
MIN_TAIL = 64
DEFAULT_TAIL = 64
SLIDING_WINDOW_TAIL = 512  # models with sliding-window layers (gemma3): the window itself

# (architecture, n_layer, n_embd) -> measured split that keeps recall
MEASURED_SPLITS = {
    # SmolLM2-135M(-Instruct), guided mode: 12 held needles, 18 is what holds real questions
    # (docs/measurements/real-questions.md#real-questions-about-real-documents)
    ("llama", 30, 576): 18,
    # Gemma 3 270M, guided: its second global layer, the lowest split whose bulk computes layer 11's input,
    # whose predicted keys were all of S = 5's departure from exact; chosen on the long set's choose half
    # (mean |ΔNLL| at q8_0's; S = 5, 3.44× exact's speed, +0.66) and judged on the other half (2.1× q8_0's):
    # docs/LONG_DOCUMENTS.md#layer-11-computed-not-predicted-by-blocks-and-s--11-2026-12-06
    ("gemma3", 18, 640): 11,
}


def default_split(info, tuned: bool = True) -> int:
    """The split RidgeFill uses unless told: the tuned one (when `tuned` and this model was tuned), else
    the measured table, else two thirds of the layers."""
    if tuned:
        from .tuned import read_tuned

        rec = read_tuned(info)
        if rec is not None:
            return int(rec["split"])
    key = (info.architecture, info.n_layer, info.n_embd)
    if key in MEASURED_SPLITS:
        return MEASURED_SPLITS[key]
    return max(1, min(info.n_layer - 1, math.ceil(2 * info.n_layer / 3)))


# Modes that decode bulk rows again through every layer: on a model with sliding-window layers, a row
# decoded again deep in the prompt needs its window's history, which only a full-size sliding-window
# cache keeps (EngineConfig.swa_full, the default).
# (architecture, n_layer, n_embd) -> what tune by fidelity found where it chose exact: said beside an answer
# RidgeFill gives at the model's split when a RidgeFill mode is asked for all the same
MEASURED_DEPARTURES = {
    # SmolLM2-135M with its shipped maps: every setting S = 9-24 moved exact's replies beyond 2x q8_0's on
    # Node's collaborator guide, guided S = 18 by 18x (docs/TUNE.md#smollm2-135m-instruct)
    ("llama", 30, 576): "measured: RidgeFill moves this model's replies beyond q8_0's yardstick on some "
                        "documents (guided S = 18: 18x on one); exact is one click away",
}


def _table_key(info) -> tuple:
    """The measured tables' key of a ModelInfo, or of anything with architecture, n_layer and n_embd."""
    return getattr(info, "architecture", None), getattr(info, "n_layer", None), getattr(info, "n_embd", None)


def departure_note(info) -> str:
    """What the app says where the model's measured default departs from exact's replies ("" elsewhere)."""
    from .tuned import read_tuned

    return "" if read_tuned(info) is not None else MEASURED_DEPARTURES.get(_table_key(info), "")


def default_note(info) -> str:
    """What a RidgeFill answer at the model's default split says of it, from one read of the tuned record:
    that the split is a guess, that the measured default departs, or nothing (tuned here)."""
    from .tuned import read_tuned

    if read_tuned(info) is not None:
        return ""
    key = _table_key(info)
    return MEASURED_DEPARTURES.get(key, "") if key in MEASURED_SPLITS else guess_note(info)


def split_is_guess(info) -> bool:
    """Whether the default split of this model was measured nowhere: not tuned here, not in the table."""
    from .tuned import read_tuned

    return read_tuned(info) is None and (info.architecture, info.n_layer, info.n_embd) not in MEASURED_SPLITS


def guess_note(info) -> str:
    """What the app says wherever RidgeFill runs at a guessed split (the timings' note)."""
    return (f"untuned: split {default_split(info, tuned=False)} is a guess (two thirds of the layers), measured on "
            "no document; use exact, or Tune for this model")


REDECODING_MODES = ("quality", "guided")


def mode_that_runs(mode: str, windows_evicted: bool) -> str:
    """What runs when `mode` is asked for: a re-decoding mode runs as speed where sliding-window layers
    evict rows (an engine without a full-size sliding-window cache; plan.py says so in the note)."""
    return "speed" if windows_evicted and mode in REDECODING_MODES else mode


# (architecture, n_layer, n_embd) -> the mode that runs by default where it is not DEFAULT_MODE
MEASURED_MODES = {
    # Gemma 3 270M at S = 11: guided's rows kept no more answers or needles than speed and moved exact's
    # replies as much on average (their size by 0.01 nats/token less), and cost a follow-up 5.6x exact's:
    # docs/LONG_DOCUMENTS.md#speed-or-guided-at-s--11-2026-12-07
    ("gemma3", 18, 640): "speed",
    # SmolLM2-135M: tune by fidelity chose exact; every setting S = 9-24, both modes, moved exact's replies
    # beyond 2x q8_0's on a document that fits its 8K (guided S = 18 by 18x): docs/TUNE.md#smollm2-135m-instruct
    ("llama", 30, 576): "off",
}


def default_mode(info, tuned: bool = True) -> str:
    """The mode RidgeFill runs for this model when none is asked for: the one its split was tuned for
    (when `tuned` and this model was tuned; "off" where tune chose exact), else the measured table, else
    DEFAULT_MODE. `info`: a
    ModelInfo, or anything with architecture, n_layer and n_embd (an EngineReady)."""
    if tuned:
        from ..protocol import RIDGEFILL_MODES
        from .tuned import read_tuned

        rec = read_tuned(info)
        if rec is not None and (rec.get("mode") in RIDGEFILL_MODES or rec.get("mode") == "off"):
            return rec["mode"]  # "off": tune found no setting that keeps the replies
    return MEASURED_MODES.get(_table_key(info), DEFAULT_MODE)


def switched_on_mode(info) -> str:
    """The mode RidgeFill runs in when the user switches it on for this model: its default, or where that
    default is exact (tuned here, or the table), DEFAULT_MODE (the GUI's mode box shows the same)."""
    mode = default_mode(info)
    return DEFAULT_MODE if mode == "off" else mode


def exact_default_note(info) -> str:
    """Why a request in the model's default mode ran exact where that default is "off" (tuned here, or the
    measured table): said in the timings' note."""
    from .tuned import EXACT_SUMMARY, read_tuned

    if read_tuned(info) is not None:
        return f"tuned: {EXACT_SUMMARY}"
    return ("measured: no RidgeFill setting keeps this model's replies within q8_0's yardstick on every document, "
            "so it runs exact by default; choose a RidgeFill mode to run it anyway")


def default_tail(info) -> int:
    return SLIDING_WINDOW_TAIL if info.has_sliding_window else DEFAULT_TAIL


def split_or_default(info, split: int | None) -> int:
    """`split` as asked, or the model's default split when None."""
    return default_split(info) if split is None else int(split)


# (architecture, n_layer, n_embd) -> the splits whose bulk attention runs windowed by default
# (docs/LONG_DOCUMENTS.md#gemma-3-at-split-5-and-windowed-bulk-attention); none until the long set says so
WINDOWED_BULK: dict[tuple, frozenset[int]] = {}


def window_bulk_or_default(info, split: int, asked: bool | None) -> bool:
    """Whether the bulk pass's attentions below `split` see the sliding window only: as asked, else the
    measured default for this model and split."""
    if asked is not None:
        return bool(asked)
    return split in WINDOWED_BULK.get((info.architecture, info.n_layer, info.n_embd), frozenset())


def tail_or_default(info, tail: int | None) -> int:
    """`tail` as asked, or the model's default tail when None."""
    return default_tail(info) if tail is None else int(tail)
