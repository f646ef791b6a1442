"""Tune chooses by fidelity (backend/tuning/tune.py): a setting that moves exact's replies on one document
loses to one that does not, even when it is faster; a setting stops at the first document it departs on;
a setting that ran another mode or gains nothing is refused; none keeping: exact; the budget leaves
settings out and says so. The measuring is fed lines as FidelityRun writes them; the real run on the
test model is tests/test_tune_run.py."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from backend.tuning import tune
from backend.tuning.documents import DOC_TOKENS, MIN_DOC_TOKENS, REFERENCE_S_PER_TOKEN, TuneDocuments, answer_at, sample_tokens, spread
from backend.tuning.fidelity import parse_setting
from backend.tuning.question_files import DocumentQuestion, QuestionedDocument

DOCS = ["a.txt", "b.txt", "c.txt"]


def _docs() -> TuneDocuments:
    qs = lambda d: [DocumentQuestion(f"{d}/{i:02d}", d, f"q{i}?", ["x"]) for i in range(2)]  # noqa: E731
    return TuneDocuments([QuestionedDocument(d, "text", qs(d)) for d in DOCS], {d: 2000 for d in DOCS}, {})


class FakeFidelity:
    """FidelityRun's interface: `document(doc, setting)` answers its questions and keeps the lines.
    `departs[setting][document]`: the ΔNLL of exact's replies there (0.002 elsewhere); q8_0 moves them by
    0.01 everywhere; `ttft[setting]`: a document's TTFT in seconds."""

    def __init__(self, departs: dict, ttft: dict, mode_run: dict | None = None):
        self.model, self.done, self.calls = "m.gguf", {}, []
        self.departs, self.ttft, self.mode_run = departs, ttft, mode_run or {}

    def document(self, doc, setting) -> None:
        self.calls.append((setting.name, doc.name))
        base = {"off": 1.0, "q8": 1.01}.get(setting.name, 1.0 + self.departs.get(setting.name, {}).get(doc.name, 0.002))
        for q in doc.questions:
            self.done[(self.model, q.id, setting.name)] = {
                "kind": "fidelity", "id": q.id, "document": doc.name, "setting": setting.name, "reply": "r",
                "nll_ref": base, "ttft_s": self.ttft.get(setting.name, 10.0),
                "mode_run": self.mode_run.get(setting.name, setting.mode), "note": ""}


def _run(fake: FakeFidelity) -> tune._TuneRun:
    engine = SimpleNamespace(info=SimpleNamespace(path="m.gguf"))
    run = tune._TuneRun(engine, _docs(), 64, None, None, None, None, lambda text: None, Path("unused.jsonl"))
    run.fidelity = fake
    run.maps_how = {s: "cached" for s in range(1, 30)}
    run.warmed = set(range(1, 30))
    run.measure_references()
    return run


ORDER = [parse_setting(s) for s in ("speed:5", "guided:5", "speed:11", "guided:11")]


def test_a_faster_setting_that_moves_replies_on_one_document_loses_to_one_that_keeps_them():
    # speed:5 is 3x exact's speed but departs on b.txt (0.05 > 2 x 0.01); guided:5 departs on a.txt
    fake = FakeFidelity({"speed:5": {"b.txt": 0.05}, "guided:5": {"a.txt": 0.03}},
                        {"off": 30.0, "speed:5": 10.0, "guided:5": 11.0, "speed:11": 17.0})
    run = _run(fake)
    measured, skipped = run.measure_settings(ORDER, budget_s=1e9, t_measure=0.0)
    assert [c.setting for c in measured] == ["speed:5", "guided:5", "speed:11"] and skipped == []
    s5, g5, s11 = measured
    assert not s5.keeps and s5.worst["document"] == "b.txt" and s5.worst["ratio"] > 2 and s5.ratio == 3.0
    assert [d for n, d in fake.calls if n == "guided:5"] == ["a.txt"]  # stopped at the first it departs on
    assert not g5.keeps and s11.keeps and s11.ratio > 1.7
    split, mode, why = tune.choose(measured, 11)
    assert (split, mode) == (11, "speed") and "speed:11" in why and "worst" in why
    assert "guided:11" not in [n for n, _ in fake.calls]  # the search stops at the first that keeps


def test_none_keeping_chooses_exact_and_a_refused_setting_is_never_chosen():
    fake = FakeFidelity({"speed:5": {"a.txt": 0.2}}, {"off": 30.0, "speed:11": 29.5, "guided:11": 31.0}, mode_run={"guided:5": "off"})
    run = _run(fake)
    measured, _ = run.measure_settings(ORDER, budget_s=1e9, t_measure=0.0)
    g5 = measured[1]
    assert g5.keeps and g5.refused.startswith("its requests ran off, not guided")  # replies kept: it ran exact
    s11 = measured[2]
    assert s11.keeps and s11.refused.startswith("it gains nothing")  # 1.02x exact's speed
    assert measured[3].refused.startswith("it gains nothing") and len(measured) == 4
    split, mode, why = tune.choose(measured, 11)
    assert mode == "off" and split == 11 and why.startswith("no setting both kept")
    assert "departed from exact's replies: speed:5" in why and "kept them but refused: guided:5" in why
    assert tune._verdict(measured[0]).endswith("departs")  # slow as well (1.0x), but what it does is depart
    assert tune._verdict(s11).endswith("refused: it gains nothing: 1.02× exact's speed (needs 1.05×)")


def test_the_budget_leaves_settings_out_and_a_resumed_setting_costs_nothing():
    fake = FakeFidelity({"speed:5": {"a.txt": 0.2}}, {"off": 30.0})
    run = _run(fake)
    run.exact_s = 100.0  # a setting is estimated at exact's time until one is measured
    measured, skipped = run.measure_settings(ORDER, budget_s=50.0, t_measure=0.0)
    assert measured == [] and [s.name for s in skipped] == ["speed:5", "guided:5", "speed:11", "guided:11"]
    for d in _docs().documents:  # a stopped run's lines, read back on resume
        fake.document(d, ORDER[0])
    measured, skipped = run.measure_settings(ORDER, budget_s=50.0, t_measure=0.0)
    assert [c.setting for c in measured] == ["speed:5"] and not measured[0].keeps and skipped[0].name == "guided:5"


def test_questions_are_those_whose_answer_lies_in_the_kept_text_spread_over_it():
    text = "alpha beta\ngamma Delta\nepsilon"
    q = lambda a, after=None: DocumentQuestion("d/00", "d", "?", [a], after=after)  # noqa: E731
    assert answer_at(text, q("gamma")) == 11 and answer_at(text, q("delta")) == 17  # case folded when not found
    assert answer_at(text, q("zeta")) == -1 and answer_at(text, DocumentQuestion("d/01", "d", "?")) == -1
    assert answer_at("x a y a", q("a", after="y")) == 6
    qs = [DocumentQuestion(f"d/{i:02d}", "d", "?") for i in range(8)]
    assert [x.id for x in spread(qs, 2)] == ["d/02", "d/06"] and len(spread(qs[:1], 4)) == 1


def test_a_slower_engine_or_a_smaller_budget_gets_shorter_documents_never_below_the_floor():
    ref = REFERENCE_S_PER_TOKEN
    assert sample_tokens(ref, 1080, 1080) == DOC_TOKENS and sample_tokens(ref / 3, 1080, 1080) == DOC_TOKENS
    assert sample_tokens(2 * ref, 1080, 1080) == DOC_TOKENS // 2  # twice as slow a token: half as long
    assert sample_tokens(ref, 540, 1080) == DOC_TOKENS // 2  # half the budget: the same
    assert sample_tokens(100 * ref, 1080, 1080) == MIN_DOC_TOKENS


def test_a_resumed_tune_cuts_its_documents_as_the_stopped_one_did(tmp_path):
    record_at = tmp_path / "model-key.json"
    record_at.with_suffix(".sample.json").write_text('{"doc_tokens": 3328, "ms_per_token": 4.9}', encoding="utf-8")
    kept = tune._Sample.of(None, record_at, None, 1080.0)  # no engine: the probe must not run again
    assert (kept.doc_tokens, kept.ms_per_token) == (3328, 4.9)
    record_at.with_suffix(".sample.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(AttributeError):  # unreadable: probed again (here there is no engine to probe)
        tune._Sample.of(None, record_at, None, 1080.0)


def test_a_setting_is_estimated_on_every_document_from_the_slowest_so_far():
    run = _run(FakeFidelity({}, {}))
    run.exact_s = 300.0
    assert run._estimate([]) == 300.0  # none measured: exact's time
    stopped = tune.Candidate("speed:5", "speed", 5, [{"document": "a.txt"}], False, 2.0, seconds=20.0)
    whole = tune.Candidate("speed:11", "speed", 11, [{"document": d} for d in DOCS], True, 1.5, seconds=90.0)
    assert run._estimate([stopped]) == 60.0 and run._estimate([stopped, whole]) == 90.0  # 20 s a document x 3


def test_the_probe_s_cut_is_kept_privately_beside_the_record(tmp_path, monkeypatch):
    monkeypatch.setattr(tune, "seconds_per_token", lambda engine: 2 * REFERENCE_S_PER_TOKEN)
    record_at = tmp_path / "tuned" / "model-key.json"
    sample = tune._Sample.of(None, record_at, None, 1080.0)
    kept = record_at.with_suffix(".sample.json")
    assert sample.doc_tokens == DOC_TOKENS // 2 and kept.is_file() and kept.stat().st_mode & 0o077 == 0
    assert tune._Sample.of(None, record_at, None, 1080.0) == sample  # read back, not probed again


def test_a_document_q8_0_moved_nothing_on_is_infinitely_far_only_where_ridgefill_moved_the_replies():
    from backend.tuning.fidelity_report import ratio_to_yardstick

    assert ratio_to_yardstick(0.02, 0.01) == 2.0 and ratio_to_yardstick(0.01, 0.0) == float("inf")
    assert ratio_to_yardstick(0.0, 0.0) == 0.0 and ratio_to_yardstick(-0.01, 0.0) == 0.0
