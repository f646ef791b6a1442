"""Tune by fidelity on the real test model (SmolLM2-135M, its shipped maps, one judge-half document cut
short): it records its choice with its figures and the defaults follow; cancelled halfway, a second run
resumes the kept lines instead of answering them again, and the kept lines go once the record exists."""
from __future__ import annotations

import pytest

from backend.engine import Engine, EngineConfig
from backend.errors import Cancelled
from backend.ridgefill import defaults
from backend.ridgefill.runtime import attach
from backend.ridgefill.tuned import read_tuned, summary, tuned_path
from backend.tuning.tune import run_tune

KW = dict(splits=[24], modes=["speed"], documents=["valgrind-faq.txt"], doc_tokens=1400, per_doc=2, needles=False)


def test_tune_records_a_fidelity_choice_and_resumes_after_a_cancel(model_path):
    engine = Engine(EngineConfig(model_path, n_ctx=2048))
    attach(engine)
    try:
        answered: list[str] = []
        stop_after = 3  # exact's two, then q8_0's first: cancelled inside the yardstick

        def cancel() -> bool:
            return len(answered) >= stop_after

        def progress(stage, done, total):
            if stage in ("exact", "q8_0 (the yardstick)", "speed:24"):
                answered.append(stage)

        with pytest.raises(Cancelled):
            run_tune(engine, on_progress=progress, cancel=cancel, **KW)
        kept = list(tuned_path(engine.info).parent.glob("*.jsonl"))
        assert len(kept) == 1 and read_tuned(engine.info) is None  # the lines kept, nothing recorded

        answered.clear()
        stop_after = 10**6
        result = run_tune(engine, on_progress=progress, cancel=cancel, **KW)
        # resumed: exact's two and q8_0's first were not answered again
        assert answered.count("exact") == 0 and answered.count("q8_0 (the yardstick)") == 1
        assert answered.count("speed:24") == 2
    finally:
        engine.close()
    (c,) = result.candidates
    assert c.setting == "speed:24" and [d["document"] for d in c.documents] == ["valgrind-faq.txt"]
    assert c.documents[0]["n"] == 2 and c.ratio is not None and c.keeps == c.documents[0]["within"]
    rec = read_tuned(engine.info)
    assert rec is not None and rec["mode"] == result.mode and rec["split"] == result.split
    assert result.mode in ("speed", "off") and defaults.default_mode(engine.info) == result.mode
    assert summary(rec) and "rule" in rec and rec["documents"]["valgrind-faq.txt"] <= 1400
    assert not list(tuned_path(engine.info).parent.glob("*.jsonl"))  # recorded: nothing left to resume
