"""The answer's sources: rows mapped to characters and pages, several documents, exact rows' cells recorded,
and sources found after real answers (the embedded model)."""
from __future__ import annotations

import pytest
import torch

from backend.completion import complete
from backend.documents import DocumentText, document_messages, read_document_parts, read_documents
from backend.prefill import ExactPrefill
from backend.protocol import CompletionRequest
from backend.ridgefill.plan import cell_recorder
from backend.sources import answer_sources, best_places, passage, place_documents, question_window
from test_document_formats import write_pdf

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
FACT_A = "The lighthouse keeper of Port Ellis is named Marta Quillfeather."
FACT_B = "The ferry to Saltmere leaves at seven minutes past nine."


def _doc(name: str, fact: str, before: int = 6, after: int = 6) -> DocumentText:
    return DocumentText(name, FILLER * before + fact + " " + FILLER * after)


def _tokens(engine, documents, question="Who keeps the lighthouse?"):
    return engine.prompt_tokens(CompletionRequest(messages=document_messages(documents, question)))


def _peak_at(engine, tokens, placed, text_piece: str, *others: tuple[str, float]):
    """Scores for every document row with a peak of 1 at the row where `text_piece` starts (and one of
    each given height at each other piece)."""
    candidates = [p for d in placed for p in d.rows]
    scores = torch.zeros(len(candidates))
    for piece, height in ((text_piece, 1.0), *others):
        for d in placed:
            at = d.doc.text.find(piece)
            if at >= 0:
                k = max(i for i, c in enumerate(d.char_of_row) if c <= at)
                scores[candidates.index(d.rows[k])] = height
    return candidates, scores


def test_a_source_points_at_its_passage_in_the_text_the_app_read(small_engine):
    doc = DocumentText("notes.txt", "\n  " + _doc("", FACT_A).text)  # leading space: offsets still index the file
    tokens = _tokens(small_engine, [doc])
    placed = place_documents(small_engine, tokens, [doc])
    assert len(placed) == 1
    for k, p in enumerate(placed[0].rows[1:-1], 1):  # each row's offset is where its piece is in the text
        piece = small_engine.token_bytes(tokens[p]).decode("utf-8")
        assert doc.text[placed[0].char_of_row[k]:].startswith(piece)
    candidates, scores = _peak_at(small_engine, tokens, placed, "Marta")
    top = best_places(placed, candidates, scores, 3)[0]
    assert top.document == "notes.txt" and top.page is None
    assert doc.text[top.start : top.end] == top.text
    assert FACT_A in top.text


def test_a_pdf_source_names_the_page_that_holds_it(small_engine, tmp_path):
    pdf = read_document_parts(write_pdf(tmp_path / "spec.pdf", ["Chapter one is about boats and tides.", FACT_B]))
    tokens = _tokens(small_engine, [pdf], "When does the ferry leave?")
    placed = place_documents(small_engine, tokens, [pdf])
    candidates, scores = _peak_at(small_engine, tokens, placed, "ferry")
    top = best_places(placed, candidates, scores, 1)[0]
    assert top.document == "spec.pdf" and "seven minutes past nine" in top.text
    assert top.page == 2
    assert pdf.text[top.start : top.end] == top.text


def test_a_question_and_its_answer_a_sentence_apart_are_one_source_and_a_far_place_another(small_engine):
    faq = (FILLER * 4 + "Will zlib decompress data from the PKWare Data Compression Library? No. The PKWare DCL"
           " uses a completely different compressed data format than does PKZIP and zlib, and the two do not mix."
           " However, you can look in zlib's contrib/blast directory for a possible solution to your problem. "
           + FILLER * 4 + FACT_B + " " + FILLER * 2)
    doc = DocumentText("faq.txt", faq)
    tokens = _tokens(small_engine, [doc], "Which directory has a solution for PKWare data?")
    placed = place_documents(small_engine, tokens, [doc])
    candidates, scores = _peak_at(small_engine, tokens, placed, "PKWare Data", ("contrib/blast", 0.5), ("ferry", 0.3))
    top, *others = best_places(placed, candidates, scores, 3)
    assert "Will zlib decompress" in top.text and "contrib/blast" in top.text and top.score == 1.0
    assert faq[top.start : top.end] == top.text
    assert any(FACT_B in s.text for s in others) and not any("contrib/blast" in s.text for s in others)


def test_several_documents_are_framed_in_order_with_their_names_and_one_as_before():
    one = document_messages([DocumentText("a.txt", "Alpha text.")], "Q?")[0].content
    assert one == document_messages("Alpha text.", "Q?")[0].content == "Read this document.\n\nAlpha text.\n\nQuestion: Q?"
    two = document_messages([DocumentText("a.txt", "Alpha."), DocumentText("b.md", "Beta.")], "Q?")[0].content
    assert two.index("Document 1: a.txt\n\nAlpha.") < two.index("Document 2: b.md\n\nBeta.") < two.index("Question: Q?")


def test_a_folder_gives_its_documents_sorted_by_name(tmp_path):
    (tmp_path / "b.txt").write_text("Beta.")
    (tmp_path / "a.md").write_text("Alpha.")
    (tmp_path / "picture.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (tmp_path / "empty.txt").write_text("")
    assert [d.name for d in read_documents([tmp_path])] == ["a.md", "b.txt"]


def test_the_probe_reads_the_question_not_the_documents_last_rows(small_engine):
    docs = [_doc("a.txt", FACT_A), _doc("b.txt", FACT_B)]
    tokens = _tokens(small_engine, docs)
    placed = place_documents(small_engine, tokens, docs)
    after = len(tokens) - placed[-1].rows.stop  # "Question: ..." and the template's assistant header
    assert 0 < after < 32
    assert question_window(tokens, placed, 32) == after
    assert question_window(tokens, placed, 4) == 4
    long = _tokens(small_engine, docs, "Who keeps the lighthouse, " + "and who else, " * 20 + "?")
    assert question_window(long, place_documents(small_engine, long, docs), 32) == 32


def test_passage_is_the_sentence_around_the_place_and_longer_when_short():
    text = "First sentence here. " + FACT_A + " Next one follows it. And the last one is here."
    at = text.index("Marta")
    start, end = passage(text, text.index("keeper"), at)
    assert text[start:end].startswith(FACT_A)  # from the sentence's start, not from the place
    assert end - start >= 100 or end == len(text)


def test_a_passage_takes_the_short_lines_beside_it_and_not_the_prose_around_it():
    options = ("## Options\n\nEach option below changes how the manual pages are installed on the system.\n\n"
               "* `--disable-setuid`\n\n  By default, man is installed as a setuid program to the user that owns"
               " the cache files.  Use this option to install man as a non-setuid program instead.\n\n"
               "* `--enable-mandirs=OS`\n\n  By default, man-db supports manual page directories in any layout.\n")
    at = options.index("setuid program to")
    start, end = passage(options, options.index("By default"), at)
    assert options[start:end].startswith("* `--disable-setuid`")  # the option the description is about
    assert "Each option below" not in options[start:end]  # a line longer than LEAD_CHARS stays out
    steps = ("Initialise the index databases for all manpaths marked as global in the man-db configuration"
             " file, which lists every one of them.\n\n* **Run** `mandb` (this step is equivalent to running makewhatis"
             " too).\n\nThe following steps are optional and depend on the system the package is being built on"
             " and on the options it was configured with.\n")
    start, end = passage(steps, 0, steps.index("manpaths"))
    assert steps[start:end].endswith("makewhatis too).")  # the command after the step it names
    prose = "First sentence here. " + FACT_A + " Next one follows it. And the last one is here."
    start, end = passage(prose, prose.index("keeper"), prose.index("Marta"))
    assert prose[start:end].startswith(FACT_A)  # one line of prose: no sentence before it joins


def test_an_exact_prefill_with_the_hook_records_every_rows_cell(small_engine):
    tokens = _tokens(small_engine, [_doc("a.txt", FACT_A)])
    plan = ExactPrefill(cells=cell_recorder(small_engine))
    assert plan.cells is not None
    plan.run(small_engine, tokens, reuse_prefix=False, on_event=None, cancel=None)
    cells = small_engine.slot.record.cells(list(range(len(tokens))))
    assert min(cells) >= 0 and len(set(cells)) == len(tokens)
    ExactPrefill().run(small_engine, tokens, reuse_prefix=False, on_event=None, cancel=None)
    assert small_engine.slot.record.with_cells() == []  # without the hook, none are known


def test_no_sources_once_the_cache_holds_another_prompt(small_engine):
    docs = [_doc("a.txt", FACT_A)]
    request = CompletionRequest(messages=document_messages(docs, "Who keeps the lighthouse?"), max_tokens=2,
                                mode="off", documents=docs, reuse_prefix=False)
    complete(small_engine, request)
    found, why = answer_sources(small_engine, small_engine.prompt_tokens(request), docs)
    assert found and why == "", why
    other = _tokens(small_engine, docs, "When does the ferry leave?")  # the same document, another question
    assert answer_sources(small_engine, other, docs) == ([], "the cache no longer holds the prompt")


@pytest.mark.parametrize("mode", ["off"])
def test_two_documents_in_one_chat_each_get_sources(small_engine, mode):
    docs = [_doc("harbour.txt", FACT_A, 4, 4), _doc("ferries.txt", FACT_B, 4, 4)]
    asked = {}
    for question, fact in (("Who is the lighthouse keeper of Port Ellis?", FACT_A),
                           ("When does the ferry to Saltmere leave?", FACT_B)):
        request = CompletionRequest(messages=document_messages(docs, question), max_tokens=8, mode=mode,
                                    documents=docs)
        result = complete(small_engine, request)
        assert result.sources and result.timings.sources_ms > 0, result.timings.note
        for s in result.sources:
            doc = next(d for d in docs if d.name == s.document)
            assert doc.text[s.start : s.end] == s.text
        asked[fact] = [s.document for s in result.sources if fact in s.text]
    assert asked[FACT_A] == ["harbour.txt"] and asked[FACT_B] == ["ferries.txt"]


def test_the_servers_reply_carries_the_sources_and_the_openai_client_reads_them(model_path):
    openai = pytest.importorskip("openai")
    from app.engine_protocol import EngineSettings
    from app.server.gateway import ProcessGateway
    from app.server.runner import LocalServer
    from app.server.schema import Defaults
    from backend.sampling import GREEDY

    content = "Read this document.\n\n" + _doc("", FACT_A, 3, 3).text + "\n\nQuestion: Who keeps the lighthouse?"
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": content}]
    gw = ProcessGateway(EngineSettings(model_path, n_ctx=2048, n_batch=256, warm_up=False)).start()
    try:
        gw.wait_ready()
        srv = LocalServer(gw, defaults=Defaults("off", sampling=GREEDY), port=0).start()
        try:
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=300)
            model = client.models.list().data[0].id
            whole = client.chat.completions.create(model=model, messages=messages, max_tokens=6).model_extra["sources"]
            chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=6, stream=True))
            streamed = chunks[-1].model_extra["sources"]
        finally:
            srv.stop()
    finally:
        gw.close()
    assert whole and whole == streamed  # the same sources, the stream's with its last chunk
    texts = {"messages[0]": messages[0]["content"], "messages[1]": content}
    for s in whole:
        assert set(s) == {"document", "page", "start", "end", "text", "score"} and s["page"] is None
        assert texts[s["document"]][s["start"] : s["end"]] == s["text"]
    assert any(FACT_A in s["text"] for s in whole)


def test_sources_are_found_after_a_prompt_cache_reload(small_engine, tmp_path):
    from backend.prompt_cache import PromptCache
    from backend.prompt_reuse import save_rows

    docs = [_doc("notes.txt", FACT_A, 8, 8)]
    cache = PromptCache(tmp_path / "prompts")

    def ask(question: str):
        request = CompletionRequest(messages=document_messages(docs, question), max_tokens=4, mode="off",
                                    documents=docs)
        return complete(small_engine, request, prompt_cache=cache)

    ask("Who keeps the lighthouse of Port Ellis?")
    assert save_rows(small_engine, cache) is not None
    small_engine.slot.truncate(0)  # as a new process: only the saved entry holds the document
    again = ask("What is the name of the lighthouse keeper?")
    assert again.timings.cache_n > 0  # the document came from the saved entry, its rows' cells derived
    assert again.sources and any(FACT_A in s.text for s in again.sources), again.timings.note


def test_a_ridgefill_prefill_records_every_rows_cell_its_tail_too(small_engine):
    """The sources score every document row by its key in its cell: the exact tail's rows included."""
    from backend.ridgefill.plan import ridgefill_prefill
    from test_quality_mode import SPLIT, ZeroMaps
    from test_ridgefill_injection import induction_prompt

    toks = induction_prompt(small_engine, 1200)
    rep = ridgefill_prefill(small_engine, toks, "speed", SPLIT, 64, maps=ZeroMaps())
    assert rep.mode == "speed" and rep.bulk_n == len(toks) - 64
    cells = small_engine.slot.record.cells(list(range(len(toks))))
    assert min(cells) >= 0 and len(set(cells)) == len(toks)

