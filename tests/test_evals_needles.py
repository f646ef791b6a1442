"""Needle items: exact token lengths, needle token positions, bulk/tail labels, determinism, bad input."""
from __future__ import annotations

import pytest

from backend.errors import DocumentError, DocumentTooLongError
from backend.recall.haystacks import Haystack, corpus_haystack, file_haystack, filler_haystack, load_haystack
from backend.recall.needles import Needle, NeedleError, build_item, make_items, needle_region


@pytest.mark.parametrize("hay", ["filler", "corpus"])
def test_every_item_is_exactly_its_length_and_needles_sit_where_it_says(small_engine, hay):
    haystack = load_haystack(hay)
    items = make_items(small_engine, lengths=[200, 517, 1024, 1900], depths=[0.0, 0.35, 0.77, 1.0],
                       variants=["single", "multikey", "multivalue", "uuid"], haystack=haystack)
    assert len(items) == 64
    for it in items:
        tokens = small_engine.prompt_tokens(it.request("off"))
        assert len(tokens) == it.length, it.id
        assert len(it.needles) == {"single": 1, "uuid": 1, "multikey": 4, "multivalue": 3}[it.variant]
        for n in it.needles:
            text = small_engine.detokenize(tokens[n.start:n.end]).strip()
            assert text.startswith("The special magic ") and text.endswith(f" is {n.value}."), (it.id, text)
            # the span is tight: one token less on either side loses part of the needle
            assert not small_engine.detokenize(tokens[n.start:n.end - 1]).endswith(".")
            assert not small_engine.detokenize(tokens[n.start + 1:n.end]).strip().startswith("The special")
        assert [n.value for n in it.asked] == it.answers
        assert it.key in it.messages[0].content.rsplit("\n\n", 1)[1]  # the question is last
    # deeper needles sit later in the prompt
    singles = [it for it in items if it.variant == "single" and it.length == 1900]
    positions = [it.needle_pos for it in sorted(singles, key=lambda it: it.depth)]
    assert positions == sorted(positions) and positions[0] < 120 < 1700 < positions[-1]


def test_region_labels_across_the_bulk_tail_boundary():
    n = [Needle("k", "1234567", start=90, end=100, asked=True)]
    # bulk rows are positions < length - tail
    assert needle_region(n, 200, 100) == "bulk"  # boundary 100: the needle's last token is row 99
    assert needle_region(n, 200, 101) == "tail"  # boundary 99: straddles, counts as tail
    assert needle_region(n, 200, 110) == "tail"  # boundary 90: wholly in the tail
    assert needle_region(n, 200, 1) == "bulk"
    assert needle_region(n, 200, None) == "tail"  # no tail given: nothing approximated
    two = n + [Needle("k", "7654321", start=150, end=160, asked=True)]
    assert needle_region(two, 200, 45) == "tail"  # every asked needle must be in the bulk


def test_region_of_a_real_item_follows_its_token_position(small_engine):
    it = build_item(small_engine, length=600, depth=0.5, variant="single", haystack=filler_haystack())
    end = it.asked[0].end
    assert it.region(600 - end) == "bulk"
    assert it.region(600 - end + 1) == "tail"
    assert it.meta(600 - end)["region"] == "bulk" and it.meta(600 - end)["needle_pos"] == it.asked[0].start


def test_items_are_seeded_and_reproducible(small_engine):
    a = build_item(small_engine, length=400, depth=0.3, variant="multikey", haystack=corpus_haystack(), seed=7)
    b = build_item(small_engine, length=400, depth=0.3, variant="multikey", haystack=corpus_haystack(), seed=7)
    c = build_item(small_engine, length=400, depth=0.3, variant="multikey", haystack=corpus_haystack(), seed=8)
    assert a.id == b.id and a.messages == b.messages and a.needles == b.needles
    assert a.id != c.id and a.answers != c.answers
    keys = [n.key for n in a.needles]
    assert len(set(keys)) == 4 and a.key == keys[0] and sum(n.asked for n in a.needles) == 1


def test_a_user_file_is_a_haystack(small_engine, tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("Mira walked to the mill. The wheel turned slowly! Was the river high? " * 20, encoding="utf-8")
    hay = file_haystack(f)
    assert hay.name.startswith("notes-") and len(hay.name) == len("notes-") + 8
    it = build_item(small_engine, length=900, depth=0.6, variant="single", haystack=hay)  # cycled: file is short
    assert len(small_engine.prompt_tokens(it.request())) == 900 and it.id.startswith(hay.name)
    (tmp_path / "tiny.txt").write_text("Too short.", encoding="utf-8")
    with pytest.raises(DocumentError, match="too little text"):
        file_haystack(tmp_path / "tiny.txt")
    with pytest.raises(DocumentError, match="not found"):
        load_haystack(tmp_path / "missing.txt")


def test_bad_requests_get_clear_errors(small_engine):
    hay = Haystack("filler", filler_haystack().text)
    with pytest.raises(NeedleError, match="depth"):
        build_item(small_engine, length=500, depth=1.5, haystack=hay)
    with pytest.raises(NeedleError, match="variant"):
        build_item(small_engine, length=500, depth=0.5, variant="sideways", haystack=hay)
    with pytest.raises(NeedleError, match="too short"):
        build_item(small_engine, length=80, depth=0.5, haystack=hay)
    with pytest.raises(DocumentTooLongError):
        build_item(small_engine, length=4096, depth=0.5, haystack=hay)  # the fixture's context is 2K


def test_a_model_without_a_chat_template_is_cued_to_answer(small_engine, monkeypatch):
    """A base model gets a plain prompt ending in the start of the answer; a chat model gets messages."""
    from dataclasses import replace

    chat = build_item(small_engine, length=400, depth=0.3, variant="multivalue", haystack=filler_haystack())
    assert chat.prompt is None and chat.request().messages == chat.messages
    # the embedded model's tokenizer, as if its GGUF carried no chat template (as Gemma 3 270M's does not)
    monkeypatch.setattr(small_engine, "info", replace(small_engine.info, chat_template=None))
    for variant, cue in (("single", "number for {key} is"), ("multivalue", "numbers for {key} are")):
        it = build_item(small_engine, length=400, depth=0.3, variant=variant, haystack=filler_haystack())
        req = it.request("off")
        assert req.messages is None and req.prompt == it.prompt
        assert it.prompt.endswith("\n\nAnswer: The special magic " + cue.format(key=it.key))
        tokens = small_engine.prompt_tokens(req)
        assert len(tokens) == it.length
        for n in it.needles:
            assert small_engine.detokenize(tokens[n.start:n.end]).strip().endswith(f" is {n.value}.")


def test_questions_about_real_documents_know_the_rows_of_their_answers(small_engine):
    from backend.recall.document_questions import question_items
    from lab.evals.selection import needed_rows

    items = question_items(small_engine, "licences")
    assert len(items) >= 20 and len({it.messages[0].content.split("\n\nQuestion:")[0] for it in items}) == 4
    for it in items:
        tokens = small_engine.prompt_tokens(it.request("off"))
        assert len(tokens) == it.length
        rows = needed_rows(small_engine, tokens, it)
        assert rows == list(range(it.needles[0].start, it.needles[0].end))  # every row of the answer
        assert small_engine.detokenize(tokens[rows[0]:rows[-1] + 1]).strip() == it.answers[0], it.id
        assert it.region(128) == "bulk"  # approximated at the default tail
    with pytest.raises(NeedleError, match="unknown question set"):
        question_items(small_engine, "novels")
