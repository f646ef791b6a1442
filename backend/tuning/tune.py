"""Tune: the split chosen by measurement for one model, recorded beside its maps.

From one capture (Get maps fits every candidate's maps from the same cached activations in seconds),
for each candidate split S in ascending order:
- bulk-needle recall: needle items built from the shipped haystacks (the prose corpus and the filler,
  backend/recall/needles.py), only those whose asked needle lies in the approximated bulk, run exact once
  and then at S in the model's default mode (guided) with the same items
  (backend/recall/run.py);
- the TTFT ratio, exact / RidgeFill, on one prompt at `ttft_length` tokens (one run each, the exact
  one shared by every candidate: a ratio to read to one decimal);
- real questions: a fixed subset of the `realqa` set (backend/tuning/items.py: 2 questions of each
  of its 16 document parts), run exact once and at S when S kept the needles (each part's prefill shared
  by its questions). Needles held at SmolLM2's old split 12 while it lost 30 of exact's 41 right real
  answers (docs/measurements/real-questions.md#real-questions-about-real-documents).
**Keeps recall** (the decision rule): on needles, at most tolerance(n) = 1 + n // 24 items *lost* (right
exact, wrong at S; one item on the default 12: a single flip is what one item per cell cannot tell
apart). A gain elsewhere does not pay for a loss (docs/measurements/split-tail-tune.md#tunes-items). The needle rule only
decides when exact itself recalls at least half the items; otherwise the items say nothing about the
maps and the split stays the model's default (the candidates are still measured and shown). On real
questions, only the k that exact answers right count (exact gets most of them wrong): at most
tolerance(k) more of them lost than gained (real answers flip both ways), judged only when k >= MIN_REAL_RIGHT; with fewer the split is judged on
needles alone, and the choice says so. The lowest candidate that keeps both is chosen and the search
stops there (higher splits approximate fewer layers); none keeping both keeps the default too, and says so.
**Which items**: 12 needles at 4,096 tokens (both haystacks, single and multikey, three depths); 2,048-token
items hardly tell SmolLM2's S = 12 from S = 9 (docs/measurements/split-tail-tune.md#tunes-items). A model with a long
context (trained on at least LONG_CONTEXT tokens, and an engine that holds LONG_LENGTH) is judged where
it is used too: 6 more items at LONG_LENGTH tokens (both haystacks, single, three depths), the TTFT
ratio is taken there, and the default budget is LONG_BUDGET_S. Real questions whose prompt does not fit
the engine's context, or is too short for RidgeFill to run, are left out.
The budget bounds the measuring time: a candidate is not started when the time spent plus its
estimate (the slowest needle step so far plus the slowest real-question step, exact's before any
candidate's) would pass it.
"""
from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from ..completion import complete
from ..errors import Cancelled, RidgeFillError
from ..recall.haystacks import corpus_haystack
from ..recall.needles import NeedleItem, build_item
from ..recall.run import run_recall
from .items import REAL_PER_PART, RealQuestions, bulk_items, real_counts, real_question_items
from .rules import (MIN_GAIN, MIN_REAL_RIGHT, RULE, candidate_keeps, informative, keeps_real,  # noqa: F401
                    keeps_recall, real_informative, real_unjudged, tolerance)

log = logging.getLogger(__name__)

DEFAULT_LENGTH = 4096  # needle items (see the module doc: 2K items hardly tell S = 9 from S = 12)
DEFAULT_TTFT_LENGTH = 4096
DEFAULT_DEPTHS = (0.15, 0.35, 0.55)
DEFAULT_VARIANTS = ("single", "multikey")
DEFAULT_HAYSTACKS = ("corpus", "filler")  # 3 depths x 2 variants x 2 haystacks = 12 items
# Exact on the 12 needles takes about 5.5 min on SmolLM2 (2 threads), on the 32 real questions about 3;
# a guided candidate about 2.5 on needles, 3 more on real questions when the needles held: exact and three
# candidates (9 losing needles, 12 and 15 holding them) fit in 25 minutes.
DEFAULT_BUDGET_S = 1500.0
SPLIT_SHARES = (0.3, 0.4, 0.5, 0.6)  # candidate splits as shares of the layers, plus the model's default
LONG_CONTEXT = 32768  # a model trained on this many tokens is also judged on LONG_LENGTH-token items
LONG_LENGTH = 16000
LONG_VARIANTS = ("single",)  # 3 depths x 2 haystacks = 6 items
# Exact takes about a minute a 16,000-token item on Gemma 3 270M (2 threads), guided about half: exact and
# four candidates fit; the real questions add about twice SmolLM2's (unmeasured: a model twice its size).
LONG_BUDGET_S = 3600.0
def long_length(engine) -> int:
    """LONG_LENGTH where the model has a long context and the engine holds such a prompt; else 0."""
    ctx_max = getattr(engine, "n_ctx_max", engine.n_ctx)
    return LONG_LENGTH if engine.info.n_ctx_train >= LONG_CONTEXT and ctx_max >= LONG_LENGTH + 512 else 0


def candidate_splits(n_layer: int, default: int) -> list[int]:
    out = {max(1, min(n_layer - 2, round(n_layer * f))) for f in SPLIT_SHARES}
    out.add(max(1, min(n_layer - 2, default)))
    return sorted(out)


@dataclass
class Candidate:
    split: int
    bulk_correct: int
    exact_correct: int
    n: int
    ratio: float | None  # exact TTFT / RidgeFill TTFT at ttft_length
    keeps: bool
    ttft_ms: float | None = None
    mode_run: str = ""
    note: str = ""
    maps: str = ""  # how the maps were had: cached | downloaded | fitted
    seconds: float = 0.0
    lost: int = 0  # items right exact and wrong at this split
    refused: str = ""  # why this candidate can never be chosen, whatever its recall ("" when it can)
    real: RealQuestions | None = None  # None: the tune ran no real questions

    def brief(self) -> dict:
        return {"split": self.split, "bulk_correct": self.bulk_correct, "exact_correct": self.exact_correct,
                "n": self.n, "lost": self.lost, "ratio": self.ratio, **({"refused": self.refused} if self.refused else {}),
                **({"real_questions": self.real.brief()} if self.real else {})}


def refusal(mode: str, recall_rows: list[dict], ttft_timings, ratio: float | None) -> str:
    """Why a measured candidate must not be chosen: its requests ran another mode than `mode` (exact,
    or speed for guided), or it is no faster than exact. "" when it may be chosen."""
    ran = [r.get("mode_run") for r in recall_rows] + [ttft_timings.mode]
    if any(m != mode for m in ran):
        other = next(m for m in ran if m != mode)
        note = next((r.get("note") for r in recall_rows if r.get("note")), "") or ttft_timings.note
        return f"its requests ran {other}, not {mode}" + (f" ({note})" if note else "")
    if ratio is None or ratio < MIN_GAIN:
        return f"it gains nothing: TTFT ratio {ratio if ratio is not None else '-'}x (needs {MIN_GAIN}x)"
    return ""


@dataclass
class TuneResult:
    model: str
    split: int
    tail: int
    mode: str
    candidates: list[Candidate]
    chosen_by: str
    n: int
    exact_correct: int
    length: int
    ttft_length: int
    exact_ttft_ms: float | None
    long_length: int  # the long items' length (0: none)
    seconds: float
    budget_s: float
    skipped: list[int] = field(default_factory=list)  # candidates left out by the budget
    record_path: str | None = None
    real: RealQuestions | None = None  # exact's side of the real questions (None: none run)
    real_left_out: list[str] = field(default_factory=list)  # document parts whose prompts did not fit

    def brief(self) -> dict:
        """What `tune --json` prints."""
        return {"model": self.model, "split": self.split, "tail": self.tail, "mode": self.mode,
                "candidates": [c.brief() for c in self.candidates]}

    def record(self) -> dict:
        d = asdict(self)
        d.pop("record_path", None)
        d["rule"] = RULE
        d["created_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return d


def choose(candidates: list[Candidate], default: int, exact_correct: int, n: int,
           real: RealQuestions | None = None) -> tuple[int, str]:
    """(split, why): the lowest candidate that keeps recall (needles, and real questions where they
    judge), else the model's default. `real`: exact's real questions (None: none run)."""
    if not informative(exact_correct, n):
        return default, (f"exact recalled only {exact_correct}/{n} items, too few to judge the maps: "
                         f"the default split {default} stays")
    unjudged = real_unjudged(real) if real else ""
    judged = real is not None and real.n > 0 and not unjudged
    keep = [c for c in candidates if c.keeps]
    if keep:
        best = min(keep, key=lambda c: c.split)
        why = f"the lowest split that keeps recall ({best.bulk_correct}/{n}, exact {exact_correct}/{n}, {best.lost} lost"
        if judged and best.real is not None:
            why += (f"; real questions: {best.real.lost} of exact's {real.exact_correct} right answers lost, "
                    f"{best.real.gained} gained")
        return best.split, why + (f"; {unjudged})" if unjudged else ")")
    both = " on both needles and real questions" if judged else ""
    return default, (f"no candidate measured kept recall{both}: the default split {default} stays"
                     + (f" ({unjudged})" if unjudged else ""))


def run_tune(engine, *, splits: list[int] | None = None, budget_s: float | None = None,
             length: int = DEFAULT_LENGTH, ttft_length: int | None = None, long: int | None = None,
             depths=DEFAULT_DEPTHS, variants=DEFAULT_VARIANTS, haystacks=DEFAULT_HAYSTACKS,
             real_per_part: int = REAL_PER_PART, mode: str | None = None, tail: int | None = None,
             capture=None, settings=None, record: bool = True, max_answer_tokens: int | None = None,
             on_progress: Callable[[str, int, int], None] | None = None,
             on_note: Callable[[str], None] | None = None,
             cancel: Callable[[], bool] | None = None) -> TuneResult:
    """Measure the candidates on `engine` and record the choice (see the module doc).

    `capture` (backend.hub.get_maps.CaptureOptions) bounds a capture that has not been made yet;
    `settings` (HubSettings) says where the maps go. `long`: the long items' length (None: long_length,
    0: none); `ttft_length` None: the long length, else DEFAULT_TTFT_LENGTH; `budget_s` None: LONG_BUDGET_S
    with long items, else DEFAULT_BUDGET_S; `real_per_part`: real questions a document part (0: none).
    Raises Cancelled between items."""
    from ..ridgefill import defaults, tuned
    from ..ridgefill.runtime import runtime

    t_start = time.perf_counter()
    info = engine.info
    default = defaults.default_split(info, tuned=False)  # the measured default, never an earlier tune's
    mode = mode or defaults.default_mode(info, tuned=False)  # the measured default, as the split
    tail = defaults.tail_or_default(info, tail)
    splits = _checked_splits(splits, info, default, runtime(engine).min_split)
    long = long_length(engine) if long is None else long
    ctx_max = getattr(engine, "n_ctx_max", engine.n_ctx)
    ttft_length = min(ttft_length or long or DEFAULT_TTFT_LENGTH, ctx_max - 32)
    budget_s = budget_s or (LONG_BUDGET_S if long else DEFAULT_BUDGET_S)
    length = min(length, ctx_max - 64)
    items = bulk_items(engine, length, depths, variants, haystacks, tail, max_answer_tokens)
    if long:
        items += bulk_items(engine, long, depths, LONG_VARIANTS, haystacks, tail, max_answer_tokens)
    real_items, left_out = real_question_items(engine, real_per_part, tail, ctx_max)
    run = _TuneRun(engine, items, mode, tail, settings, capture, cancel, on_progress,
                   on_note or (lambda text: log.info("tune: %s", text)), real_items)
    at = f"{length} and {long}" if long else f"{length}"
    run.note(f"tune {info.name}: splits {splits}, mode {mode}, tail {tail}, {run.n} bulk-needle items at {at} "
             f"tokens, {len(real_items)} real questions, TTFT at {ttft_length} tokens, budget {budget_s:.0f} s")
    if left_out:
        run.note(f"real questions: parts left out (too long for the context or too short for RidgeFill): {left_out}")
    with tempfile.TemporaryDirectory(prefix="ridgefill-tune-") as tmp:
        run.out = Path(tmp) / "tune.jsonl"
        run.fetch_maps(splits[0])  # a capture (once per model) happens before anything is timed
        t_measure = time.perf_counter()
        exact = run.measure_exact(ttft_length)
        candidates, skipped = run.measure_candidates(splits, exact, budget_s, t_measure)
    split, why = choose(candidates, default, exact.correct, run.n, exact.real)
    result = TuneResult(info.name, split, tail, mode, candidates, why, run.n, exact.correct, length, ttft_length,
                        round(exact.ttft_ms, 1), long, round(time.perf_counter() - t_start, 1), budget_s, skipped,
                        real=exact.real, real_left_out=left_out)
    if record:
        result.record_path = str(tuned.write_tuned(info, result.record()))
    run.note(f"chosen: S = {split} ({why})")
    return result


def _checked_splits(splits: list[int] | None, info, default: int, floor: int = 1) -> list[int]:
    """The candidates asked for (sorted, once each), else the standard ones, a share below `floor` (the
    lowest split RidgeFill can run at: runtime.min_split) moved up to it; each must leave layers to map."""
    splits = sorted(set(splits)) if splits else sorted({max(s, floor) for s in candidate_splits(info.n_layer, default)})
    lo = max(1, floor)
    bad = [s for s in splits if not lo <= s <= info.n_layer - 2]
    if bad:
        why = f" (below {lo} the bulk pass cannot see a late layer's cache cells)" if lo > 1 else ""
        raise RidgeFillError(f"A split must lie in {lo}..{info.n_layer - 2} for this {info.n_layer}-layer "
                             f"model{why}, not {bad[0]}.")
    return splits


@dataclass
class _Exact:
    """The exact model's side, measured once and compared with every candidate."""
    correct: int
    right: set[str]  # ids of the items exact answered right
    ttft_ms: float
    ttft_item: NeedleItem  # the prompt every TTFT ratio is timed on
    needles_s: float  # what a candidate's needles and TTFT take at most, until one is measured
    real: RealQuestions  # n = 0: no real questions
    real_right: set[str] = field(default_factory=set)  # ids of the real questions exact answered right


@dataclass
class _TuneRun:
    """What the steps of one tune share: the engine, the items, the mode and tail measured, the callbacks,
    the results file and how each split's maps were had."""
    engine: object
    items: list[NeedleItem]
    mode: str
    tail: int
    settings: object
    capture: object
    cancel: Callable[[], bool] | None
    on_progress: Callable[[str, int, int], None] | None
    note: Callable[[str], None]
    real_items: list[NeedleItem] = field(default_factory=list)
    out: Path | None = None  # the run's recall lines (a temporary file)
    maps_how: dict[int, str] = field(default_factory=dict)  # split -> cached | downloaded | fitted

    @property
    def n(self) -> int:
        return len(self.items)

    def progress(self, stage: str, done: int, total: int) -> None:
        if self.on_progress is not None:
            self.on_progress(stage, done, total)

    def fetch_maps(self, split: int) -> None:
        from ..hub.get_maps import get_maps

        with self.engine.scratch():  # a capture fills the context
            self.maps_how[split] = get_maps(self.engine.info.path, split, self.settings, download=False,
                                            engine=self.engine, capture=self.capture, on_progress=self.progress,
                                            on_note=self.note, cancel=self.cancel).how

    def recall(self, items: list[NeedleItem], mode: str, split: int | None, stage: str) -> list[dict]:
        """`items` run in `mode` at `split` (questions about one document share its prefill)."""
        return run_recall(self.engine, items, [mode], split, self.tail, self.out, cancel=self.cancel,
                          on_progress=lambda p: self.progress(stage, p.done, p.total))

    def measure_exact(self, ttft_length: int) -> _Exact:
        engine, n = self.engine, self.n
        hay, hay_cache = corpus_haystack(), {}
        # One short exact request: the first decode of a context pays one-off set-up costs.
        complete(engine, build_item(engine, length=256, depth=0.5, haystack=hay, _hay_cache=hay_cache).request("off"),
                 cancel=self.cancel)
        t0 = time.perf_counter()
        rows = self.recall(self.items, "off", None, "exact recall")
        items_s = time.perf_counter() - t0
        correct = sum(bool(r["correct"]) for r in rows)
        ttft_item = build_item(engine, length=ttft_length, depth=0.5, haystack=hay, _hay_cache=hay_cache)
        self.progress("exact TTFT", 0, 1)
        ttft = _ttft(engine, ttft_item, "off", None, self.tail, self.cancel)
        self.progress("exact TTFT", 1, 1)
        self.note(f"exact: {correct}/{n} bulk needles, TTFT {ttft.ttft_ms / 1000:.1f} s at {ttft_length} tokens")
        if not informative(correct, n):
            self.note(f"exact recalls only {correct}/{n}: the items cannot judge the maps")
        real, real_right = self.measure_exact_real()
        return _Exact(correct, {r["id"] for r in rows if r["correct"]}, ttft.ttft_ms, ttft_item,
                      needles_s=items_s + ttft.ttft_ms / 1000 + 5.0, real=real, real_right=real_right)

    def measure_exact_real(self) -> tuple[RealQuestions, set[str]]:
        """Exact's side of the real questions: how many it answers right, and which."""
        if not self.real_items:
            return RealQuestions(0, 0), set()
        t0 = time.perf_counter()
        rows = self.recall(self.real_items, "off", None, "exact real questions")
        right = {r["id"] for r in rows if r["correct"]}
        real = RealQuestions(len(rows), len(right), seconds=round(time.perf_counter() - t0, 1))
        why = real_unjudged(real)
        self.note(f"exact: {len(right)}/{real.n} real questions right" + (f"; {why}" if why else ""))
        return real, right

    def measure_candidates(self, splits: list[int], exact: _Exact, budget_s: float,
                           t_measure: float) -> tuple[list[Candidate], list[int]]:
        """(measured, skipped): in ascending order until one keeps recall or the budget would be passed."""
        candidates: list[Candidate] = []
        for i, s in enumerate(splits):
            spent = time.perf_counter() - t_measure
            estimate = self.estimate_s(candidates, exact)
            if i > 0 and spent + estimate > budget_s:
                self.note(f"budget: {spent:.0f} s spent, a candidate takes about {estimate:.0f} s: "
                          f"splits {splits[i:]} not measured")
                return candidates, splits[i:]
            c = self.measure_candidate(s, exact)
            candidates.append(c)
            if c.keeps:
                return candidates, splits[i + 1:]
        return candidates, []

    @staticmethod
    def estimate_s(candidates: list[Candidate], exact: _Exact) -> float:
        """A candidate's time at most: the slowest needle step so far plus the slowest real-question step
        (exact's, until a candidate's is measured; none when they cannot judge)."""
        real_s = [c.real.seconds for c in candidates if c.real and c.real.correct is not None]
        needles_s = [c.seconds - (c.real.seconds if c.real else 0.0) for c in candidates]
        real = max(real_s) if real_s else (exact.real.seconds if real_informative(exact.real.exact_correct) else 0.0)
        return (max(needles_s) if needles_s else exact.needles_s) + real

    def measure_candidate(self, s: int, exact: _Exact) -> Candidate:
        from ..ridgefill.runtime import warm_up

        engine, n = self.engine, self.n
        tc = time.perf_counter()
        if s not in self.maps_how:
            self.fetch_maps(s)
        with engine.scratch():
            warm_up(engine, s)  # maps and weights loaded outside the timings
        rec = self.recall(self.items, self.mode, s, f"S={s} recall")
        bulk_correct = sum(bool(r["correct"]) for r in rec)
        lost = sum(1 for r in rec if r["id"] in exact.right and not r["correct"])
        fast = _ttft(engine, exact.ttft_item, self.mode, s, self.tail, self.cancel)
        ratio = round(exact.ttft_ms / fast.ttft_ms, 2) if fast.ttft_ms else None
        refused = refusal(self.mode, rec, fast, ratio)
        needles = keeps_recall(lost, exact.correct, n)
        real, real_rows = self.measure_real(s, exact, run=needles and not refused)
        refused = refused or refusal(self.mode, real_rows, fast, ratio)
        c = Candidate(s, bulk_correct, exact.correct, n, ratio, candidate_keeps(needles, real, refused),
                      ttft_ms=round(fast.ttft_ms, 1), mode_run=fast.mode, note=fast.note or "",
                      maps=self.maps_how[s], seconds=round(time.perf_counter() - tc, 1), lost=lost, refused=refused,
                      real=real if self.real_items else None)
        verdict = f"refused: {refused}" if refused else ("keeps recall" if c.keeps else "loses recall")
        self.note(f"S={s}: {bulk_correct}/{n} bulk needles (exact {exact.correct}/{n}, {lost} lost){real.text()}, "
                  f"TTFT ratio {ratio if ratio is not None else '-'}x, {verdict}")
        return c

    def measure_real(self, s: int, exact: _Exact, run: bool) -> tuple[RealQuestions, list[dict]]:
        """The real questions at `s`, when they can judge it and `run` (the needles kept, not refused)."""
        base = exact.real
        if not run or not self.real_items or not real_informative(base.exact_correct):
            return RealQuestions(base.n, base.exact_correct), []
        t0 = time.perf_counter()
        rows = self.recall(self.real_items, self.mode, s, f"S={s} real questions")
        right, lost, gained = real_counts(exact.real_right, rows)
        return RealQuestions(base.n, base.exact_correct, right, lost, gained, keeps_real(lost, gained, base.exact_correct),
                             seconds=round(time.perf_counter() - t0, 1)), rows


def _ttft(engine, item, mode: str, split: int | None, tail: int, cancel):
    if cancel is not None and cancel():
        raise Cancelled("tune cancelled")
    req = item.request(mode, split, tail)
    req.max_tokens, req.reuse_prefix = 1, False
    return complete(engine, req, cancel=cancel).timings
