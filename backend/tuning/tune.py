"""Tune: the setting (split and mode, or exact) chosen by fidelity for one model, recorded beside its maps.

The items (backend/tuning/documents.py): the long set's judge-half documents that the model holds, each
cut to DOC_TOKENS (shorter on an engine slower a token than Gemma 3 270M on two threads, so that the tune
keeps to its time: `sample_tokens`), a few questions each. Exact answers every question first; llama.cpp's q8_0 K/V cache
answers them too (the yardstick); each setting then answers them and exact's reply is teacher-forced on
its cache (backend/tuning/fidelity.py: each document's prefill is shared by its questions).
**The rule** (rules.py): a setting keeps replies when, on every document, its mean ΔNLL is at most 2×
q8_0's mean |ΔNLL| on the same questions. Settings are measured in order of speed, lowest split first and
speed before guided at a split; a setting stops at the first document it departs on (documents shortest
first), and the first setting that keeps every document, ran its own mode and is faster than exact
(TTFT summed over the documents, measured in the same run) is chosen. None: the model runs exact by
default, and the record says why. Needles in the bulk, exact against the chosen setting, are a check
beside it: reported, never a vote.
The budget bounds the measuring: exact and q8_0 always run; a setting is not started when the time spent
plus the slowest setting so far on every document (extrapolated; exact's time before any) would pass it.
The run's lines are kept per model until its record is written, so a tune stopped or cancelled resumes.
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from ..errors import RidgeFillError
from ..private_files import private_dir, write_text_private
from ..recall.run import load_results
from .documents import PER_DOC, TuneDocuments, sample_tokens, seconds_per_token, tune_documents
from .fidelity import EXACT, MAX_TOKENS, FidelityRun, Setting, parse_setting
from .fidelity_report import YARDSTICK, per_document
from .needle_check import needle_check
from .rules import MIN_GAIN, RULE

log = logging.getLogger(__name__)

# Measuring time; a first capture comes on top. Exact, q8_0 and S = 11 on Gemma 3 270M take about 13
# minutes on two threads (docs/TUNE.md), so the whole tune stays within 20.
DEFAULT_BUDGET_S = 1080.0
SPLIT_SHARES = (0.3, 0.4, 0.6, 0.7, 0.8)  # candidate splits as shares of the layers, plus the model's default
MODES = ("speed", "guided")  # at a split, speed costs less than guided (guided adds the rows it makes exact)


def candidate_splits(n_layer: int, default: int, floor: int = 1) -> list[int]:
    out = {round(n_layer * f) for f in SPLIT_SHARES} | {default}
    return sorted({max(floor, 1, min(n_layer - 2, s)) for s in out})


@dataclass
class Candidate:
    setting: str  # "speed:11"
    mode: str
    split: int
    documents: list[dict]  # per_document's rows: document, n, dnll, q8_abs, ratio, within
    keeps: bool
    ratio: float | None  # exact's TTFT / this setting's, summed over the documents it ran
    seconds: float = 0.0
    refused: str = ""  # why it cannot be chosen although it kept replies
    maps: str = ""  # how its maps were had: cached | downloaded | fitted

    @property
    def worst(self) -> dict | None:
        return max(self.documents, key=lambda d: d["ratio"]) if self.documents else None


@dataclass
class TuneResult:
    model: str
    split: int
    tail: int
    mode: str  # a RidgeFill mode, or "off": no setting kept the replies
    candidates: list[Candidate]
    chosen_by: str
    documents: dict[str, int]  # document -> prompt tokens
    questions: int
    doc_tokens: int
    seconds: float
    budget_s: float
    skipped: list[str] = field(default_factory=list)  # settings the budget left out
    left_out: dict[str, str] = field(default_factory=dict)
    needles: dict | None = None  # the check at the chosen setting
    ms_per_token: float | None = None  # exact's prefill a token here (what cut the documents)
    record_path: str | None = None

    def brief(self) -> dict:
        """What `tune --json` prints."""
        return {"model": self.model, "split": self.split, "tail": self.tail, "mode": self.mode,
                "chosen_by": self.chosen_by, "candidates": [_brief(c) for c in self.candidates],
                "skipped": self.skipped, "needles": self.needles}

    def record(self) -> dict:
        d = asdict(self)
        d.pop("record_path", None)
        d["rule"] = RULE
        d["created_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return d


def _brief(c: Candidate) -> dict:
    worst = c.worst or {}
    return {"setting": c.setting, "keeps": c.keeps, "ratio": c.ratio, "worst_document": worst.get("document"),
            "worst_ratio": worst.get("ratio"), "documents": len(c.documents), **({"refused": c.refused} if c.refused else {})}


def choose(candidates: list[Candidate], default_split: int) -> tuple[int, str, str]:
    """(split, mode, why): the first candidate (in measuring order) that keeps replies and is not refused;
    none: exact at the default split, and why (they departed, or kept replies but were refused)."""
    best = next((c for c in candidates if c.keeps and not c.refused), None)
    if best is None:
        departed = [c.setting for c in candidates if not c.keeps]
        refused = [f"{c.setting} ({c.refused})" for c in candidates if c.keeps]
        parts = ([f"departed from exact's replies: {', '.join(departed)}"] if departed else []) + \
                ([f"kept them but refused: {', '.join(refused)}"] if refused else [])
        return default_split, EXACT, f"no setting both kept exact's replies and ran faster ({'; '.join(parts) or 'none measured'}): exact"
    w = best.worst
    return best.split, best.mode, (f"the fastest setting that keeps exact's replies on every document: {best.setting}, "
                                   f"worst {w['document']} at {w['ratio']:.1f}× q8_0's, {best.ratio:.2f}× exact's speed")


def run_tune(engine, *, splits: list[int] | None = None, modes: list[str] | None = None,
             budget_s: float | None = None, doc_tokens: int | None = None, per_doc: int | None = None,
             documents: list[str] | None = None, tail: int | None = None, needles: bool = True,
             capture=None, settings=None, record: bool = True,
             on_progress: Callable[[str, int, int], None] | None = None,
             on_note: Callable[[str], None] | None = None,
             cancel: Callable[[], bool] | None = None) -> TuneResult:
    """Measure the settings on `engine` and record the choice (see the module doc). `documents`: only
    these judge-half documents (tests). Raises Cancelled between questions; a rerun resumes. Writes no
    record when the budget ended before a setting kept the replies (the lines stay for a rerun)."""
    from ..ridgefill import defaults, tuned
    from ..ridgefill.runtime import runtime

    t_start = time.perf_counter()
    info = engine.info
    record_at = tuned.tuned_path(info)
    if record_at is None:
        raise RidgeFillError("this model's header does not say enough to key a tuned record")
    default = defaults.default_split(info, tuned=False)  # the measured default, never an earlier tune's
    tail = defaults.tail_or_default(info, tail)
    splits = _checked_splits(splits, info, default, runtime(engine).min_split)
    order = [parse_setting(f"{m}:{s}") for s in splits for m in (modes or MODES)]
    budget_s = budget_s or DEFAULT_BUDGET_S
    sample = _Sample.of(engine, record_at, doc_tokens, budget_s)
    docs = tune_documents(engine, tail, sample.doc_tokens, per_doc or PER_DOC, documents)
    if not docs.documents:
        raise RidgeFillError(f"no judge-half document fits this model's context to tune it on: {docs.left_out}")
    run = _TuneRun(engine, docs, tail, settings, capture, cancel, on_progress,
                   on_note or (lambda text: log.info("tune: %s", text)),
                   record_at.with_suffix(f".{_run_key(docs, tail)}.jsonl"))
    run.note(f"tune {info.name}: {len(docs.documents)} documents ({run.questions} questions, at most "
             f"{sample.doc_tokens:,} tokens: {sample.ms_per_token:.2f} ms a token exact), settings "
             f"{[s.name for s in order]}, tail {tail}, budget {budget_s:.0f} s")
    try:
        run.fetch_maps(splits[0])  # a capture (once per model) happens before anything is measured
        t_measure = time.perf_counter()
        run.measure_references()
        candidates, skipped = run.measure_settings(order, budget_s, t_measure)
    finally:
        run.close()
    split, mode, why = choose(candidates, default)
    chosen = next((c for c in candidates if c.setting == f"{mode}:{split}"), None)
    check = run.needles(chosen) if needles and chosen is not None else None
    result = TuneResult(info.name, split, tail, mode, candidates, why, docs.tokens, run.questions, sample.doc_tokens,
                        round(time.perf_counter() - t_start, 1), budget_s, [s.name for s in skipped],
                        docs.left_out, check, sample.ms_per_token)
    if record and candidates and (chosen is not None or not skipped):  # exact only once every setting was tried
        result.record_path = str(tuned.write_tuned(info, result.record()))
        for path in record_at.parent.glob(f"{record_at.stem}.*"):
            if path != record_at:
                path.unlink(missing_ok=True)  # recorded: nothing left to resume
    elif record:
        why = (f"the budget ended before a setting kept exact's replies ({', '.join(s.name for s in skipped)} not "
               "measured): nothing recorded; rerun to resume, or give more --budget-s")
    run.note(f"chosen: {'exact' if mode == EXACT else f'{mode} at S = {split}'} ({why})")
    return result


@dataclass
class _Sample:
    """How long the cut documents are, and the probe that said so: kept beside the record until it is
    written, so that a resumed tune cuts them as the stopped one did (the probe varies a few percent)."""
    doc_tokens: int
    ms_per_token: float

    @classmethod
    def of(cls, engine, record_at: Path, doc_tokens: int | None, budget_s: float) -> "_Sample":
        kept = record_at.with_suffix(".sample.json")
        try:
            old = json.loads(kept.read_text(encoding="utf-8"))
            if doc_tokens is None and isinstance(old.get("doc_tokens"), int):
                return cls(old["doc_tokens"], float(old["ms_per_token"]))
        except (OSError, ValueError, TypeError, AttributeError, KeyError):
            pass  # none kept, or unreadable: probe again
        s_per_token = seconds_per_token(engine)
        sample = cls(doc_tokens or sample_tokens(s_per_token, budget_s, DEFAULT_BUDGET_S), round(1000 * s_per_token, 3))
        if doc_tokens is None:  # beside the record, private as it is
            private_dir(kept.parent)
            write_text_private(kept, json.dumps(asdict(sample)))
        return sample


def _run_key(docs: TuneDocuments, tail: int) -> str:
    """What a resumed run must share with the stopped one: the documents, their questions, the tail."""
    facts = [tail, sorted(docs.tokens.items()), [q.id for d in docs.documents for q in d.questions]]
    return hashlib.sha256(json.dumps(facts).encode()).hexdigest()[:10]


def _checked_splits(splits: list[int] | None, info, default: int, floor: int = 1) -> list[int]:
    """The candidates asked for (sorted, once each), else the standard ones from `floor` (the lowest split
    RidgeFill can run at: runtime.min_split); each must leave layers to map."""
    splits = sorted(set(splits)) if splits else candidate_splits(info.n_layer, default, floor)
    lo = max(1, floor)
    bad = [s for s in splits if not lo <= s <= info.n_layer - 2]
    if bad:
        why = f" (below {lo} the bulk pass cannot see a late layer's cache cells)" if lo > 1 else ""
        raise RidgeFillError(f"A split must lie in {lo}..{info.n_layer - 2} for this {info.n_layer}-layer "
                             f"model{why}, not {bad[0]}.")
    return splits


@dataclass
class _TuneRun:
    """What the steps of one tune share: the engine (and q8_0's while it runs), the documents, the fidelity
    run, the callbacks and how each split's maps were had."""
    engine: object
    docs: TuneDocuments
    tail: int
    settings: object
    capture: object
    cancel: Callable[[], bool] | None
    on_progress: Callable[[str, int, int], None] | None
    note: Callable[[str], None]
    lines_path: Path
    maps_how: dict[int, str] = field(default_factory=dict)
    warmed: set[int] = field(default_factory=set)  # splits whose maps and weights are loaded
    q8_engine: object = None
    exact_s: float = 0.0  # exact's measuring time: a setting's estimate until one is measured
    resumed_s: float = 0.0  # the references' seconds a stopped run spent (its kept lines)

    def __post_init__(self):
        self.fidelity = FidelityRun(self._engine_for, Path(self.engine.info.path).name, self.lines_path,
                                    tail=self.tail, cancel=self.cancel, on_line=self._on_line)
        self.stage, self.done_n = "", 0

    @property
    def questions(self) -> int:
        return sum(len(d.questions) for d in self.docs.documents)

    def _engine_for(self, setting: Setting):
        if setting.engine_key == (self.engine.config.kv_type, self.engine.config.n_ubatch):
            return self.engine
        if self.q8_engine is None:  # the yardstick's cache: the same weights, its K/V stored as q8_0
            n_ctx = max(self.docs.tokens.values()) + 2 * MAX_TOKENS + 64
            self.q8_engine = self.engine.sibling(n_ctx, swa_full=self.engine.config.swa_full, kv_type=setting.kv_type)
        return self.q8_engine

    def close(self) -> None:
        if self.q8_engine is not None:
            self.q8_engine.close()
            self.q8_engine = None

    def _on_line(self, line: dict) -> None:
        self.done_n += 1
        if self.on_progress is not None:
            self.on_progress(self.stage, self.done_n, self.questions)

    def _begin(self, stage: str, setting: Setting) -> None:
        self.stage = stage
        self.done_n = sum(1 for d in self.docs.documents for q in d.questions
                          if (self.fidelity.model, q.id, setting.name) in self.fidelity.done)

    def fetch_maps(self, split: int) -> None:
        from ..hub.get_maps import get_maps

        with self.engine.scratch():  # a capture fills the context
            self.maps_how[split] = get_maps(self.engine.info.path, split, self.settings, download=False,
                                            engine=self.engine, capture=self.capture,
                                            on_progress=self.on_progress, on_note=self.note, cancel=self.cancel).how

    def _seconds(self, which: Callable[[dict], bool]) -> float:
        """The measuring seconds the kept lines of `which` took (a resumed run counts a stopped one's)."""
        return sum(r.get("seconds") or 0.0 for r in self._lines() if which(r))

    def measure_references(self) -> None:
        """Exact's replies, and the yardstick's (q8_0) distance from them, on every document."""
        t0 = time.perf_counter()
        kept_exact = self._seconds(lambda r: r["setting"] == EXACT)
        self.resumed_s = kept_exact + self._seconds(lambda r: r["setting"] == YARDSTICK)
        for name, stage in ((EXACT, "exact"), (YARDSTICK, "q8_0 (the yardstick)")):
            setting = parse_setting(name)
            self._begin(stage, setting)
            for doc in self.docs.documents:
                self.fidelity.document(doc, setting)
            if name == EXACT:
                self.exact_s = time.perf_counter() - t0 + kept_exact
        self.close()
        self.note(f"exact and q8_0 answered {self.questions} questions in {time.perf_counter() - t0:.0f} s")

    def measure_settings(self, order: list[Setting], budget_s: float,
                         t_measure: float) -> tuple[list[Candidate], list[Setting]]:
        """(measured, skipped): in order until one keeps replies or the budget would be passed."""
        measured: list[Candidate] = []
        before = self._seconds(lambda r: r["setting"] not in (EXACT, YARDSTICK))  # a stopped run's settings
        for i, setting in enumerate(order):
            spent = time.perf_counter() - t_measure + before + self.resumed_s
            estimate = self._estimate(measured)
            if spent + estimate > budget_s and not self._all_done(setting):
                self.note(f"budget: {spent:.0f} s spent, a setting takes up to {estimate:.0f} s: "
                          f"{[s.name for s in order[i:]]} not measured")
                return measured, order[i:]
            c = self.measure(setting)
            measured.append(c)
            if c.keeps and not c.refused:
                return measured, []
        return measured, []

    def _estimate(self, measured: list[Candidate]) -> float:
        """A setting's time on every document: the slowest measured one's, extrapolated from the documents
        it ran (one that departed stopped early); exact's until one is measured."""
        n = len(self.docs.documents)
        full = [c.seconds * n / max(1, len(c.documents)) for c in measured]
        return max(full) if full else self.exact_s

    def _all_done(self, setting: Setting) -> bool:
        """Whether a resumed run holds every line of `setting` already (it costs nothing to read)."""
        return all((self.fidelity.model, q.id, setting.name) in self.fidelity.done
                   for d in self.docs.documents for q in d.questions)

    def measure(self, setting: Setting) -> Candidate:
        """`setting` document by document, stopping at the first it departs on."""
        from ..ridgefill.runtime import warm_up

        t0 = time.perf_counter()
        if setting.split not in self.warmed:
            if setting.split not in self.maps_how:
                self.fetch_maps(setting.split)
            with self.engine.scratch():
                warm_up(self.engine, setting.split)  # maps and weights loaded outside the timings
            self.warmed.add(setting.split)
        self._begin(setting.name, setting)
        rows, ran = [], []
        for doc in self.docs.documents:
            self.fidelity.document(doc, setting)
            ran.append(doc.name)
            rows = per_document(self._lines(), setting.name)
            if not all(r["within"] for r in rows):
                break
        keeps = len(rows) == len(self.docs.documents) and all(r["within"] for r in rows)
        ratio = self._speed(setting.name, ran)
        c = Candidate(setting.name, setting.mode, setting.split, rows, keeps, ratio,
                      round(time.perf_counter() - t0, 1), self._refusal(setting, ran, ratio), self.maps_how[setting.split])
        self.note(_verdict(c))
        return c

    def _lines(self) -> list[dict]:
        return [r for (m, _, _), r in self.fidelity.done.items() if m == self.fidelity.model]

    def _doc_lines(self, setting: str, names: list[str]) -> list[dict]:
        return [r for r in self._lines() if r["setting"] == setting and r["document"] in names and "skipped" not in r]

    def _speed(self, setting: str, names: list[str]) -> float | None:
        """Exact's TTFT over the documents `names` / the setting's (each document's slowest question: the
        one whose prefill it shared)."""
        def total(name):
            per_doc: dict[str, float] = {}
            for r in self._doc_lines(name, names):
                per_doc[r["document"]] = max(per_doc.get(r["document"], 0.0), r.get("ttft_s") or 0.0)
            return sum(per_doc.values())
        ours, exact = total(setting), total(EXACT)
        return round(exact / ours, 2) if ours > 0 and exact > 0 else None

    def _refusal(self, setting: Setting, names: list[str], ratio: float | None) -> str:
        other = next((r for r in self._doc_lines(setting.name, names) if r.get("mode_run") != setting.mode), None)
        if other is not None:
            note = f" ({other['note']})" if other.get("note") else ""
            return f"its requests ran {other.get('mode_run')}, not {setting.mode}{note}"
        if ratio is None or ratio < MIN_GAIN:
            return f"it gains nothing: {ratio if ratio is not None else '-'}× exact's speed (needs {MIN_GAIN}×)"
        return ""

    def needles(self, chosen: Candidate) -> dict:
        return needle_check(self.engine, chosen.mode, chosen.split, self.tail, self.lines_path.with_suffix(".needles.jsonl"),
                            self.cancel, self.on_progress, self.note)


def _verdict(c: Candidate) -> str:
    """One setting's line; one that departs says so whatever its speed (a refusal matters only if it keeps)."""
    w = c.worst
    where = f"worst {w['document']} at {w['ratio']:.1f}× q8_0's (ΔNLL {w['dnll']:+.3f})" if w else "no document"
    verdict = "departs" if not c.keeps else (f"refused: {c.refused}" if c.refused else "keeps replies")
    speed = f"{c.ratio:.2f}×" if c.ratio else "-"
    return f"{c.setting}: {len(c.documents)} documents, {where}, {speed} exact's speed, {verdict}"


def load_lines(path: Path) -> list[dict]:
    """A tune's kept lines (tests and the lab read them)."""
    return [r for r in load_results(path) if r.get("kind") == "fidelity"]
