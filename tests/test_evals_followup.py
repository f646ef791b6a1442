"""The follow-up eval: a second question about another fact in the same chat reuses the first turn's
cache, for a chat model (messages) and a base model (a plain prompt that goes on after the reply)."""
from __future__ import annotations

from dataclasses import replace

from backend.recall.haystacks import filler_haystack
from backend.recall.needles import build_item
from lab.evals.followup import follow_up_request, run_followup


def _item(engine):
    return build_item(engine, length=700, depth=0.3, variant="multikey", haystack=filler_haystack())


def test_a_follow_up_reuses_the_first_turn_and_asks_for_another_key(small_engine):
    item = _item(small_engine)
    second = next(n for n in item.needles if not n.asked)
    req = follow_up_request(item, item.request("off"), " 1234567.", second.key)
    assert req.reuse_prefix and req.prompt is None
    assert [m.role for m in req.messages] == ["user", "assistant", "user"] and second.key in req.messages[-1].content
    rec = run_followup(small_engine, item, "off", None, None)
    assert rec["follow_cache_n"] > item.length // 2  # the document was not read again
    assert isinstance(rec["follow_correct"], bool) and rec["follow_ttft_ms"] > 0


def test_a_base_models_follow_up_goes_on_after_its_reply_and_is_cued_to_answer(small_engine, monkeypatch):
    # the embedded model's tokenizer, as if its GGUF carried no chat template (as Gemma 3 270M's does not)
    monkeypatch.setattr(small_engine, "info", replace(small_engine.info, chat_template=None))
    item = _item(small_engine)
    second = next(n for n in item.needles if not n.asked)
    req = follow_up_request(item, item.request("off"), " 1234567.\n", second.key)
    assert req.messages is None and req.reuse_prefix
    assert req.prompt.startswith(item.prompt + " 1234567.\n\n")
    assert req.prompt.endswith(f"\n\nAnswer: The special magic number for {second.key} is")
    rec = run_followup(small_engine, item, "off", None, None)
    assert rec["follow_cache_n"] > item.length // 2
