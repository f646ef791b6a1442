"""Sampling on the embedded model through llama.cpp's sampler chain: a seed gives the same text again,
greedy picks the argmax of the same logits as before, the default repeat penalty breaks a greedy loop and
the default DRY one it does not reach, a loop is stopped and said; the model file's recommended sampling
becomes its defaults."""
from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

from backend.protocol import ChatMessage, CompletionRequest
from backend.sampling import APP_DEFAULTS, DRY_SEQUENCE_BREAKERS, GREEDY, SamplingParams, model_defaults
from backend.stopping import AnswerEnd, LoopWatch
from backend.completion import complete

# Greedy on the embedded model says one line again and again (found by trying; see the report in
# docs/measurements/sampling.md#sampling-defaults).
LOOPING = "List the days of the week."
SAMPLED = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.1, seed=7)


def ask(text: str, **kw) -> CompletionRequest:
    return CompletionRequest(messages=[ChatMessage("user", text)], **kw)


def most_repeated(text: str) -> int:
    """How often the answer's most frequent sentence (or list line) comes."""
    watch = LoopWatch()
    watch.feed(text + "\n")
    return max(watch.seen.values(), default=0)


def test_the_same_seed_and_parameters_give_the_same_text_twice(small_engine):
    req = ask("Write a short story about a cat.", max_tokens=40, sampling=SAMPLED)
    first = complete(small_engine, req)
    again = complete(small_engine, req)
    assert first.text == again.text and first.tokens == again.tokens and len(first.tokens) > 10
    other = complete(small_engine, replace(req, sampling=replace(SAMPLED, seed=8)))
    assert other.tokens != first.tokens  # the seed is what draws: another one, another story
    greedy = complete(small_engine, replace(req, sampling=GREEDY))
    assert greedy.tokens != first.tokens  # and the draw is not greedy's


def test_greedy_picks_the_argmax_of_the_logits(small_engine):
    """Temperature 0 with the penalties off: each token is numpy's argmax of the logits before it, as the
    hand-written sampler chose (every greedy answer, test and eval stays as it was)."""
    req = ask("Explain what a tide is.", max_tokens=24)
    result = complete(small_engine, req)
    tokens = small_engine.prompt_tokens(req)
    small_engine.slot.prefill(tokens, reuse_prefix=False)
    expected = []
    for _ in range(len(result.tokens)):
        tok = int(np.argmax(small_engine.last_logits()))
        expected.append(tok)
        small_engine.slot.decode([tok], len(small_engine.slot.record), logits_last=True)
    assert result.tokens == expected


def test_a_greedy_loop_stops_looping_with_the_default_repeat_penalty(small_engine):
    greedy = complete(small_engine, ask(LOOPING, max_tokens=128))
    assert most_repeated(greedy.text) >= 3, greedy.text  # the loop this test is about
    penalized = replace(GREEDY, repeat_penalty=APP_DEFAULTS.repeat_penalty, repeat_last_n=APP_DEFAULTS.repeat_last_n)
    for sampling in (penalized, replace(APP_DEFAULTS, seed=1), replace(APP_DEFAULTS, seed=2)):
        answer = complete(small_engine, ask(LOOPING, max_tokens=128, sampling=sampling))
        assert most_repeated(answer.text) < 3, (sampling, answer.text)


# A line of 104 tokens, twice: greedy goes on copying it, one copy every 105 tokens. The repeat penalty's
# 64-token window never holds a copy's start when the next copy begins; DRY, over the whole answer, does.
LONG_LINE = ("The client receives this response, reads the keepAlive headers, checks that keepAliveMsecs is still "
             "1024, opens a second socket to the same server, sends the next request with the same headers, and "
             "waits for the server to answer before it closes the first socket, writes the time of the answer to "
             "the log file, counts the free sockets in the agent's pool, and puts the second socket back into the "
             "pool so that the next request to this host can use it again.")
COPYING = LONG_LINE + "\n" + LONG_LINE + "\n"
PASSKEY_LIST = "Passkey: 5820417\nPasskey: 5820417\nPasskey:"  # greedy copies the line on
SAID_AGAIN = "I like the sea. I like the sea."  # greedy says it again and again


def copies(text: str) -> int:
    return text.count(LONG_LINE[:60])


def test_dry_stops_a_loop_the_repeat_penalty_does_not_reach(small_engine):
    def answer(sampling):
        return complete(small_engine, CompletionRequest(prompt=COPYING, max_tokens=240, sampling=sampling)).text

    assert copies(answer(GREEDY)) >= 2  # the loop this test is about
    assert copies(answer(replace(APP_DEFAULTS, dry_multiplier=0.0))) >= 2  # the repeat penalty alone: still
    assert APP_DEFAULTS.dry and copies(answer(APP_DEFAULTS)) == 1
    assert copies(answer(replace(APP_DEFAULTS, dry_penalty_last_n=64))) >= 2  # DRY's window must reach back too


def test_a_number_said_again_is_not_a_repeat_to_break(small_engine):
    """Digits are tokens of their own: with llama.cpp's sequence breakers DRY penalizes the later digits of a
    number said again, and the passkey came back as "59362". The app's defaults break DRY's sequences at
    digits too. A list the model copies (from a fresh slot: a reused prefix's K/V, computed in another batch,
    can tip a greedy choice) rather than a chat answer, whose wording differs from one CPU to another."""
    def numbers(sampling):
        request = CompletionRequest(prompt=PASSKEY_LIST, max_tokens=40, sampling=sampling, reuse_prefix=False)
        return re.findall(r"\d{4,}", complete(small_engine, request).text)

    said = numbers(APP_DEFAULTS)
    assert len(said) >= 2 and set(said) == {"5820417"}, said
    assert set(numbers(replace(APP_DEFAULTS, dry_sequence_breakers=DRY_SEQUENCE_BREAKERS))) - {"5820417"}


def test_a_loop_is_stopped_and_said(small_engine):
    def answer(stop_loops):
        return complete(small_engine, CompletionRequest(prompt=SAID_AGAIN, max_tokens=128, stop_loops=stop_loops,
                                                        reuse_prefix=False))

    looped, full = answer(True), answer(False)
    assert looped.finish_reason == "loop" and full.finish_reason == "length"
    assert len(looped.tokens) < len(full.tokens) and full.text.startswith(looped.text)
    assert most_repeated(looped.text) == 3  # cut at the third time, not later


def test_stop_strings_end_the_answer_before_them(small_engine):
    full = complete(small_engine, ask(LOOPING, max_tokens=32))
    stop = "Wednesday"
    assert stop in full.text
    cut = complete(small_engine, ask(LOOPING, max_tokens=32, stop=[stop]))
    assert cut.finish_reason == "stop" and cut.text == full.text[: full.text.find(stop)]


def test_loop_watch_counts_sentences_and_list_lines_not_code():
    assert not LoopWatch().feed("The sky is blue. The sky is blue. ")
    assert LoopWatch().feed("The sky is blue. The sky is blue. The sky is blue. ")
    assert LoopWatch().feed("The sky is blue.\nThe sky  is BLUE.\nthe sky is blue!\n")  # spacing, case, mark
    assert LoopWatch().feed("1. Monday\n2. Tuesday\n3. Monday\n4. Friday\n5. Monday\n")  # a list going round
    assert not LoopWatch().feed("}\n}\n}\n}\n")  # no words
    assert not LoopWatch().feed("Yes.\nYes.\nYes.\n")  # too short for a sentence, and not a list line
    end = AnswerEnd(["END"], stop_loops=True)
    assert [end.feed(p) for p in ("one E", "N", "D two")] == [None, None, "stop"] and end.text == "one "


def test_the_model_files_recommendation_becomes_its_defaults(tmp_path):
    from backend.model_file import read_model_header
    from backend.model_file import read_model_info
    from tests.tiny_gguf import write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "rec.gguf", "llama", sampling={
        "general.sampling.temp": 0.6, "general.sampling.top_k": 20, "general.sampling.top_p": 0.95,
        "general.sampling.penalty_last_n": 128})
    for info in (read_model_header(path), read_model_info(path)):  # the GUI's fast reader and the engine's
        params, source = model_defaults(dict(info.sampling))
        assert (params.temperature, params.top_k, params.top_p, params.repeat_last_n) == (0.6, 20, 0.95, 128)
        assert params.min_p == APP_DEFAULTS.min_p and params.repeat_penalty == APP_DEFAULTS.repeat_penalty
        assert "model file" in source
    plain = write_tiny_gguf(tmp_path / "plain.gguf", "llama")
    params, source = model_defaults(dict(read_model_header(plain).sampling))
    assert params == APP_DEFAULTS and "app's defaults" in source


def test_parameters_out_of_range_are_refused():
    for bad in (dict(temperature=-0.1), dict(top_p=1.5), dict(top_k=-1), dict(repeat_penalty=0.0), dict(seed=-2),
                dict(dry_multiplier=-1.0), dict(dry_base=0.9), dict(dry_allowed_length=0), dict(dry_penalty_last_n=-2),
                dict(dry_sequence_breakers=("",)), dict(dry_sequence_breakers="\n")):
        with pytest.raises(ValueError, match=next(iter(bad))):
            replace(GREEDY, **bad).check()
    assert SamplingParams.from_dict({"temperature": 0.5, "top_k": "many", "seed": -9, "dry_base": 0.1,
                                     "dry_sequence_breakers": [""]}, APP_DEFAULTS) == \
        replace(APP_DEFAULTS, temperature=0.5)  # a saved file's bad values fall back, the good ones stay
    saved = SamplingParams.from_dict({"dry_multiplier": 1, "dry_sequence_breakers": ["\n", "##"]}, APP_DEFAULTS)
    assert (saved.dry_multiplier, saved.dry_sequence_breakers) == (1.0, ("\n", "##"))  # JSON's list, an int


def test_nan_and_infinity_are_refused_where_plain_comparisons_let_them_through():
    import json

    for name in ("temperature", "top_p", "min_p", "repeat_penalty", "presence_penalty", "dry_multiplier", "dry_base"):
        for bad in (float("nan"), float("inf")):
            with pytest.raises(ValueError, match=f"{name} must be a finite number"):
                replace(GREEDY, **{name: bad}).check()
    saved = json.loads('{"temperature": NaN, "top_p": NaN, "min_p": Infinity, "repeat_penalty": NaN}')  # settings.json
    assert SamplingParams.from_dict(saved, APP_DEFAULTS) == APP_DEFAULTS  # each falls back to its default
