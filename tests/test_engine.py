"""The exact engine on the real embedded model."""
import pytest

from backend.completion import complete
from backend.errors import Cancelled, DocumentTooLongError
from backend.protocol import ChatMessage, CompletionRequest, ProgressEvent, TokenEvent
from backend.sampling import GREEDY
from lab.evals.nll import token_logprobs

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "


def ask(text, **kw):
    return CompletionRequest(messages=[ChatMessage("user", text)], **kw)


def test_tokenize_round_trip(small_engine):
    text = "Ridge maps predict late layers, naïvely: 12 × 34."
    tokens = small_engine.tokenize(text, add_special=False)
    assert len(tokens) > 5
    assert small_engine.detokenize(tokens) == text


def test_chat_uses_the_models_template(small_engine):
    prompt = small_engine.format_chat([ChatMessage("user", "Hi there")])
    assert prompt.startswith("<|im_start|>system")
    assert "<|im_start|>user\nHi there<|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_streaming_tokens_and_timings(small_engine):
    events = []
    result = complete(small_engine, ask("Count from one to five.", max_tokens=12, reuse_prefix=False),
                                   on_event=events.append)
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    assert len(tokens) == result.timings.predicted_n == len(result.tokens) > 0
    assert "".join(e.text for e in tokens) == result.text
    t = result.timings
    assert t.mode == "off" and t.cache_n == 0
    assert t.prompt_n == result.prompt_tokens
    assert 0 < t.prompt_ms <= t.ttft_ms
    assert t.prompt_per_second > 0 and t.predicted_per_second > 0


def test_chunked_prefill_reports_progress_per_chunk(small_engine):
    events = []
    result = complete(small_engine, ask(FILLER * 12, max_tokens=1, reuse_prefix=False), on_event=events.append)
    progress = [e for e in events if isinstance(e, ProgressEvent)]
    n_chunks = -(-result.prompt_tokens // small_engine.config.n_batch)
    assert len(progress) == n_chunks >= 2
    assert [p.done for p in progress] == sorted(p.done for p in progress)
    assert progress[-1].done == progress[-1].total == result.prompt_tokens


def test_greedy_answers_are_reproducible(small_engine):
    a = complete(small_engine, ask("Name a colour.", max_tokens=8, reuse_prefix=False))
    b = complete(small_engine, ask("Name a colour.", max_tokens=8, reuse_prefix=False))
    assert a.tokens == b.tokens


def test_prefix_is_reused_across_turns(small_engine):
    first = complete(small_engine, ask(FILLER * 4 + "What colour is the sky?", max_tokens=8))
    follow = CompletionRequest(
        messages=[ChatMessage("user", FILLER * 4 + "What colour is the sky?"),
                  ChatMessage("assistant", first.text), ChatMessage("user", "And the grass?")],
        max_tokens=8,
    )
    second = complete(small_engine, follow)
    assert second.timings.cache_n > first.prompt_tokens * 0.9
    assert second.timings.prompt_n == second.prompt_tokens - second.timings.cache_n


def test_reused_prefix_gives_the_same_logits(small_engine):
    import numpy as np

    tokens = small_engine.tokenize(FILLER * 6 + "What colour is the sun?")
    small_engine.slot.prefill(tokens, reuse_prefix=False)
    fresh = small_engine.last_logits()
    small_engine.slot.truncate(len(tokens) - 20)  # as if a later turn shared all but 20 tokens
    cache_n, _ = small_engine.slot.prefill(tokens, reuse_prefix=True)
    reused = small_engine.last_logits()
    assert cache_n == len(tokens) - 20
    assert reused.argmax() == fresh.argmax()
    assert np.abs(reused - fresh).max() < 0.05 * np.abs(fresh).max()


def test_cancel_between_chunks_keeps_done_work(small_engine):
    req = ask(FILLER * 40 + "Question?", max_tokens=4, reuse_prefix=False)
    seen = []
    with pytest.raises(Cancelled):
        complete(small_engine, req, on_event=seen.append, cancel=lambda: len(seen) >= 2)
    assert len(small_engine.slot.tokens) == 2 * small_engine.config.n_batch
    again = complete(small_engine, CompletionRequest(**{**req.__dict__, "reuse_prefix": True}))
    assert again.timings.cache_n == 2 * small_engine.config.n_batch


def test_too_long_prompt_is_refused_with_numbers(small_engine):
    with pytest.raises(DocumentTooLongError) as info:
        complete(small_engine, ask(FILLER * 150, max_tokens=64))
    err = info.value
    assert err.prompt_tokens > err.limit == small_engine.n_ctx == 2048
    assert f"{err.prompt_tokens:,}" in str(err)


def test_token_logprobs_match_between_chunkings(small_engine):
    tokens = small_engine.tokenize(FILLER * 20)
    long = token_logprobs(small_engine, tokens, 300)
    short = token_logprobs(small_engine, tokens, 40)
    assert long.shape == (300,) and (long <= 0).all()
    assert abs(long[-40:].sum() - short.sum()) < 0.05 * abs(short.sum()) + 0.5


def test_eval_callback_can_observe_nodes(small_engine):
    """The cb_eval installed at construction reaches a hook (RidgeFill builds on this)."""
    import ctypes

    names = []

    class Hook:
        def wants(self, tensor):
            names.append(ctypes.string_at(tensor + 256).split(b"\0")[0].decode())
            return False

        def seen(self, tensor):
            return True

    small_engine.context.eval_hook = Hook()
    try:
        complete(small_engine, ask("Hi", max_tokens=1, reuse_prefix=False))
    finally:
        small_engine.context.eval_hook = None
    assert "l_out-0" in names and "l_out-28" in names


def test_greedy_answer_contains_the_expected_word(small_engine):
    result = complete(small_engine, ask("Remember this: the passkey is 5820417.\nWhat is the passkey? "
                                       "Answer with the number only.", max_tokens=16, sampling=GREEDY))
    assert "5820417" in result.text
    assert result.finish_reason in ("stop", "length")


def test_streamed_pieces_add_up_to_an_answer_cut_at_its_stop_string(small_engine):
    """The engine cuts an answer at a stop string once (backend/stopping.py): its pieces never show part
    of one and add up to the answer, which ends with the reason "stop"."""
    full = complete(small_engine, ask("Count from one to five.", max_tokens=12, reuse_prefix=False)).text
    stop = full[len(full) // 2: len(full) // 2 + 3]
    events = []
    result = complete(small_engine, ask("Count from one to five.", max_tokens=12, reuse_prefix=False, stop=[stop]),
                      on_event=events.append)
    streamed = "".join(e.text for e in events if isinstance(e, TokenEvent))
    assert result.text == streamed == full[: full.find(stop)] and result.finish_reason == "stop"


def test_an_engine_without_flash_attention_answers_exact_and_says_why(model_path):
    """Flash attention off (an exact baseline the lab times) transposes V: RidgeFill, which writes V rows,
    must refuse and run exact, with the reason in the timings."""
    from backend.engine import Engine, EngineConfig

    with Engine(EngineConfig(model_path=model_path, n_ctx=2048, n_threads=1, flash_attn=False)) as engine:
        request = CompletionRequest(prompt="The harbour was busy that morning. " * 200, max_tokens=2, mode="speed",
                                    split=12, tail=64, reuse_prefix=False)
        result = complete(engine, request)
        assert result.timings.mode == "off" and "flash attention" in result.timings.note
        assert result.tokens
