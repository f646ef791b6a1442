"""The chat's session model (app/chat_session.py), without Qt or an engine: the turns a request carries,
the document in the first user turn, the request the controls' values make, the titles."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from app import chat_session
from app.conversations import Conversation, ConversationStore, Document, Message
from backend.documents import DocumentText
from backend.protocol import DEFAULT_MAX_TOKENS

ROOT = Path(__file__).resolve().parents[1]
DOC = "The lighthouse keeper's cat is named Biscuit."


def turns(msgs) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in msgs]


def conversation(*messages: Message, document: str | None = None) -> Conversation:
    return Conversation(messages=list(messages), document=Document("doc.txt", document) if document else None)


def test_a_first_question_is_the_only_turn():
    assert turns(chat_session.history(Conversation(), "Hello?")) == [("user", "Hello?")]


def test_the_chat_so_far_comes_before_the_question():
    conv = conversation(Message("user", "Who keeps the light?"), Message("assistant", "Anna."))
    assert turns(chat_session.history(conv, "Since when?")) == [
        ("user", "Who keeps the light?"), ("assistant", "Anna."), ("user", "Since when?")]


def test_an_unanswered_question_is_left_out_so_the_turns_alternate():
    failed = Message("assistant", "", complete=False, note="The engine process stopped unexpectedly")
    conv = conversation(Message("user", "first"), failed)
    assert turns(chat_session.history(conv, "again")) == [("user", "again")]
    # two questions in a row (the answer in between failed): the later one stands for both
    conv = conversation(Message("user", "a"), Message("assistant", "A."), Message("user", "b"), failed,
                        Message("user", "c"), Message("assistant", "C."))
    assert turns(chat_session.history(conv, "d")) == [
        ("user", "a"), ("assistant", "A."), ("user", "c"), ("assistant", "C."), ("user", "d")]


def test_an_answer_cut_off_or_empty_is_left_out_but_a_stopped_complete_one_stays():
    cut = Message("assistant", "Half an ans", complete=False)
    conv = conversation(Message("user", "q1"), cut)
    assert turns(chat_session.history(conv, "q2")) == [("user", "q2")]
    conv = conversation(Message("user", "q1"), Message("assistant", "  \n"))
    assert turns(chat_session.history(conv, "q2")) == [("user", "q2")]
    stopped = Message("assistant", "Half an ans", note="stopped by you")  # complete: what was said stays
    conv = conversation(Message("user", "q1"), stopped)
    assert turns(chat_session.history(conv, "q2")) == [("user", "q1"), ("assistant", "Half an ans"), ("user", "q2")]


def test_the_document_goes_into_the_first_user_turn_only():
    conv = conversation(Message("user", "Who is Biscuit?"), Message("assistant", "A cat."), document=DOC)
    msgs = chat_session.history(conv, "Whose cat?")
    assert [m.role for m in msgs] == ["user", "assistant", "user"]
    assert msgs[0].content.startswith("Read this document.") and DOC in msgs[0].content
    assert msgs[0].content.endswith("Question: Who is Biscuit?")
    assert msgs[2].content == "Whose cat?" and DOC not in msgs[2].content
    first = chat_session.history(conversation(document=DOC), "Whose cat?")
    assert len(first) == 1 and DOC in first[0].content and first[0].content.endswith("Question: Whose cat?")


def test_the_request_carries_split_and_tail_only_with_ridgefill_on():
    conv = conversation(Message("user", "q1"), Message("assistant", "a1."), document=DOC)
    req = chat_session.build_request(conv, "q2", mode="speed", split=12, tail=64, max_tokens=32)
    assert (req.mode, req.split, req.tail, req.max_tokens) == ("speed", 12, 64, 32)
    assert turns(req.messages) == turns(chat_session.history(conv, "q2")) and req.reuse_prefix
    req = chat_session.build_request(conv, "q2", mode="off", split=12, tail=64)
    assert (req.mode, req.split, req.tail, req.max_tokens) == ("off", None, None, DEFAULT_MAX_TOKENS)


def test_other_request_fields_can_be_set():
    req = chat_session.build_request(Conversation(), "q", mode="guided", split=3, tail=64, reuse_prefix=False,
                                     stop_loops=True)
    assert (req.mode, req.split, req.reuse_prefix, req.stop_loops) == ("guided", 3, False, True)


def test_an_untitled_conversation_is_named_after_its_document_or_its_first_question():
    conv = Conversation()
    chat_session.attach(conv, Path("notes") / "harbour.txt", DOC)
    assert conv.title == "harbour.txt"
    assert conv.document == Document("harbour.txt", DOC, (), str(Path("notes") / "harbour.txt"))
    chat_session.attach(conv, "other.md", "x")
    assert conv.title == "harbour.txt" and [d.name for d in conv.documents] == ["harbour.txt", "other.md"]  # named once
    conv = Conversation()
    answer = chat_session.ask(conv, "What is the name of the lighthouse keeper's cat, please?")
    assert conv.title == "What is the name of the lighthouse keepe"  # its first 40 characters
    assert conv.messages == [Message("user", "What is the name of the lighthouse keeper's cat, please?"), answer]
    assert (answer.role, answer.content, answer.complete) == ("assistant", "", False)
    chat_session.ask(conv, "And the dog?")
    assert conv.title.startswith("What is") and chat_session.answer_count(conv) == 2


def test_the_session_model_imports_no_qt():
    code = ("import sys, app.chat_session; bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('PySide6', 'shiboken6', 'ui')); print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_request_carries_every_attached_document_and_one_fewer_after_a_removal():
    conv = Conversation()
    chat_session.attach(conv, "a.txt", DOC)
    chat_session.attach(conv, "spec.pdf", DocumentText("spec.pdf", "Page one.\fPage two.", (0, 10)))
    req = chat_session.build_request(conv, "Whose cat?", mode="off")
    assert [(d.name, d.page_starts) for d in req.documents] == [("a.txt", ()), ("spec.pdf", (0, 10))]
    assert "Document 1: a.txt" in req.messages[0].content and "Document 2: spec.pdf" in req.messages[0].content
    answer = chat_session.ask(conv, "Whose cat?")
    answer.content, answer.complete = "Anna's.", True
    chat_session.remove(conv, 0)
    assert conv.messages[-1] == Message("note", "Document a.txt removed: the next answer reads 1 document")
    req = chat_session.build_request(conv, "And the pages?", mode="off")
    assert [d.name for d in req.documents] == ["spec.pdf"] and DOC not in req.messages[0].content
    assert [m.role for m in req.messages] == ["user", "assistant", "user"]  # the note is not a turn
    assert chat_session.build_request(Conversation(), "q", mode="off").documents is None


def test_a_note_says_what_was_added_once_the_chat_has_begun():
    conv = Conversation()
    assert chat_session.note_added(conv, [chat_session.attach(conv, "a.txt", DOC)]) is None  # nothing said yet
    chat_session.ask(conv, "q").content = "a"
    added = [chat_session.attach(conv, "b.md", "B"), chat_session.attach(conv, "c.md", "C")]
    assert chat_session.note_added(conv, added).content == "Documents b.md, c.md added: the next answer reads 3 documents"


def test_saved_conversations_keep_their_documents_and_old_files_with_one_still_load(tmp_path):
    store = ConversationStore(tmp_path)
    conv = Conversation()
    chat_session.attach(conv, "a.txt", DOC)
    chat_session.attach(conv, "spec.pdf", DocumentText("spec.pdf", "Page one.\fPage two.", (0, 10)))
    chat_session.ask(conv, "q").sources = [{"document": "spec.pdf", "page": 2, "start": 10, "end": 19,
                                            "text": "Page two.", "score": 0.9}]
    store.save(conv)
    back = store.load(conv.id)
    assert back.documents == conv.documents and back.documents[1].page_starts == (0, 10)
    assert back.messages[-1].sources[0]["page"] == 2
    old = {"id": "old1", "title": "old", "document": {"name": "d.txt", "text": DOC, "n_tokens": 12},
           "messages": [{"role": "user", "content": "q"}]}
    (tmp_path / "old1.json").write_text(json.dumps(old), encoding="utf-8")
    assert [(d.name, d.text) for d in store.load("old1").documents] == [("d.txt", DOC)]
    bad = {**old, "id": "bad1", "documents": [{"name": "x"}]}
    (tmp_path / "bad1.json").write_text(json.dumps(bad), encoding="utf-8")
    with pytest.raises(ValueError, match="documents"):
        store.load("bad1")


def test_a_message_with_a_field_from_another_version_loads_and_keeps_it(tmp_path):
    store = ConversationStore(tmp_path)
    newer = {"id": "new1", "title": "from a newer version", "future": {"x": 1},
             "messages": [{"role": "user", "content": "q", "reaction": "👍", "extra": [1]},
                          {"role": "assistant", "content": "a", "complete": True, "model": "gemma"}]}
    (tmp_path / "new1.json").write_text(json.dumps(newer), encoding="utf-8")
    assert [c.id for c in store.load_all()] == ["new1"] and not list(tmp_path.glob("*.bad-*"))
    conv = store.load("new1")
    assert [m.content for m in conv.messages] == ["q", "a"]
    chat_session.ask(conv, "again")
    store.save(conv)  # written back by this version: the fields it does not know are still there
    saved = json.loads((tmp_path / "new1.json").read_text(encoding="utf-8"))["messages"]
    assert (saved[0]["reaction"], saved[0]["extra"], saved[1]["model"]) == ("👍", [1], "gemma")
    assert saved[2]["content"] == "again" and "extra" not in saved[2]


class CharCounter:
    """An engine that counts a request's characters as its tokens (what _count asks of a real one)."""
    n_ctx_max = 10_000

    def prompt_tokens(self, request):
        return list("".join(m.role + m.content for m in request.messages))

    def answer_reserve(self, max_tokens):
        return max_tokens

    def check_fits(self, n, max_tokens):
        pass


def test_a_count_with_the_documents_apart_counts_what_the_answer_sends():
    from app.engine_child import _count
    from app.engine_protocol import CountRequest

    conv = Conversation(documents=[Document("a.txt", " Alpha text. "), Document("b.txt", "Beta text.")],
                        messages=[Message("user", "Who?"), Message("assistant", "Anna.")])
    full = chat_session.build_request(conv, "When?", mode="off")
    apart = CountRequest(chat_session.build_request(conv, "When?", mode="off", frame_documents=False),
                         documents_apart=True)
    assert "Alpha" not in "".join(m.content for m in apart.request.messages)  # nothing copied to ask
    assert apart.request.documents == full.documents
    assert turns(apart.framed().messages) == turns(full.messages)
    assert _count(CharCounter(), apart, None, None) == _count(CharCounter(), CountRequest(full), None, None)
    assert CountRequest(full).framed() is full  # a request framed already is counted as it is
