"""`python -m app chat --doc FILE [--doc FILE|FOLDER ...] "question"`: answer a question about documents, with
the answer's sources (backend/sources.py) and timings."""
from __future__ import annotations

import json
import os
import sys
import time

from app.commands.common import format_timings, open_engine, stderr_progress
from app.commands.sampling_args import add_sampling_args, sampling_from_args
from app.model_tuning import untuned_note
from backend.answers import answers_agree
from backend.completion import complete
from backend.documents import document_messages, read_documents
from backend.errors import DocumentError, DocumentTooLongError
from backend.idle_work import IdleWork
from backend.prompt_cache import PromptCache
from backend.protocol import DEFAULT_MAX_TOKENS, MODEL_DEFAULT, MODES, ChatMessage, CompletionRequest, TokenEvent
from backend.stopping import LOOP_NOTE

API_KEY_ENV = "RIDGEFILL_API_KEY"  # `chat --server`'s key when --api-key is not given


def register(sub) -> None:
    p = sub.add_parser("chat", help="ask a question, optionally about a document")
    p.add_argument("question")
    p.add_argument("--doc", action="append", default=[], metavar="PATH",
                   help="a document to ask about (.txt, .md, .pdf, .docx, .html, .epub or .odt), or a folder: its "
                        "documents, sorted by name; repeatable, in the order given")
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    p.add_argument("--mode", default=None, choices=MODES,
                   help="off (exact) or a RidgeFill mode (default: the app's, guided on most models)")
    p.add_argument("--split", type=int, default=None, help="RidgeFill split S")
    p.add_argument("--tail", type=int, default=None, help="RidgeFill exact tail T")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="end the answer before TEXT (repeatable)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    add_sampling_args(p)
    p.add_argument("--no-cache", action="store_true",
                   help="neither load nor save the prompt cache (a document is otherwise saved once prefilled)")
    p.add_argument("--refine", action="store_true",
                   help="before exiting, make the approximated rows exact and save the cache again")
    p.add_argument("--check", action="store_true",
                   help="then check RidgeFill's answer against the exact model's on that exact cache, and print both")
    g = p.add_argument_group("remote", "ask an OpenAI-compatible server instead of this machine's engine")
    g.add_argument("--server", default=None, metavar="URL",
                   help="the server's address, e.g. http://192.168.1.20:8080 (this app's `serve`, llama.cpp's server, "
                        "vLLM); the documents are read here and sent in the messages")
    g.add_argument("--api-key", default=None, metavar="KEY",
                   help=f"the server's API key, if it needs one (better: set {API_KEY_ENV}, which stays out of the "
                        "process list and the shell's history)")
    g.add_argument("--server-model", default=None, metavar="ID", help="a model the server lists (default: its first)")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.server:
        from app.commands.chat_remote import run_remote

        args.api_key = args.api_key or os.environ.get(API_KEY_ENV, "")  # the flag, else the environment's
        return run_remote(args)
    documents = read_documents(args.doc) if args.doc else None
    if documents:
        messages = document_messages(documents, args.question)
    else:
        messages = [ChatMessage("user", args.question)]
    engine = open_engine(args)
    # As in the GUI: the app's RidgeFill mode, the model's sampling, a loop stopped
    request = CompletionRequest(
        messages=messages, max_tokens=args.max_tokens, mode=args.mode or MODEL_DEFAULT,
        split=args.split, tail=args.tail, sampling=sampling_from_args(args, engine.info.sampling),
        stop=args.stop, stop_loops=True, documents=documents,
    )
    progress = stderr_progress()
    stream = not args.json and sys.stdout.isatty()

    def on_event(event) -> None:
        progress(event)
        if stream and isinstance(event, TokenEvent):
            print(event.text, end="", flush=True)

    cache = None if args.no_cache else PromptCache()
    t_question = time.perf_counter()
    try:
        result = complete(engine, request, on_event=on_event, prompt_cache=cache)
    except DocumentTooLongError as exc:
        if documents and len(documents) > 1:
            raise DocumentError(f"{exc} {which_fit(engine, documents, args.question, exc.limit - exc.reserved)}") from None
        raise
    document = _keep_document(engine, cache, request, result, refine=args.refine or args.check, check=args.check)
    if document.answer_check is not None:  # the time a user waits from the question to the verdict
        document.answer_check["after_question_s"] = round(time.perf_counter() - t_question, 2)
    if args.json:
        print(json.dumps({"answer": result.text, "finish_reason": result.finish_reason,
                          "prompt_tokens": result.prompt_tokens, "timings": result.timings.as_dict(),
                          "document": document.as_dict(), "sources": [s.as_dict() for s in result.sources],
                          "check": document.answer_check,
                          "untuned": "" if args.split is not None else untuned_note(engine.info)}))
        return 0
    print(("" if stream else result.text) + "\n")
    if result.sources:
        print(sources_text(result.sources) + "\n")
    print(format_timings(result.timings))
    untuned = untuned_row(engine.info, args.split, result.timings.note)
    if untuned:
        print(untuned)
    if result.finish_reason == "loop":
        print(f"  {LOOP_NOTE}")
    if document.tokens:
        saved = "saved" if document.saved else "not saved"
        print(f"  {'prompt cache':<20} {document.line()}, {saved}" + (f" ({document.note})" if document.note else ""))
    if args.check:
        print("\n" + check_text(document.answer_check, result.timings.mode))
    return 0


def untuned_row(info, asked_split: int | None, timings_note: str) -> str:
    """The timings' row that says this model's split is a guess, where the timings' note does not say it
    already (it does when RidgeFill ran at the guess); "" for a measured split or one the person chose."""
    note = "" if asked_split is not None else untuned_note(info)
    return f"  {'tuning':<20} {note}" if note and note not in timings_note else ""


def check_text(check: dict | None, mode: str) -> str:
    """`chat --check`'s verdict, and both answers when they differ."""
    if check is None:
        why = "it ran exact" if mode == "off" else "no row was approximated or the document could not be made exact"
        return f"Check: nothing to check ({why})."
    dnll = "" if check["dnll"] is None else f"; ΔNLL of RidgeFill's reply on the exact cache {check['dnll']:+.3f} nats/token"
    head = f"Check ({check['after_question_s']:.1f} s after the question, {check['seconds']:.1f} s of it the check{dnll}): "
    if check["verdict"] == "checked" and answers_agree(check["exact_answer"], check["shown_answer"]):
        return head + "the exact model gives the same answer. ✓"
    if check["verdict"] == "checked":
        return head + f"the exact model finds this answer as likely as its own. ✓\n  exact:     {' '.join(check['exact_answer'].split())}"
    return (head + "the exact model answers otherwise.\n"
            f"  exact:     {' '.join(check['exact_answer'].split())}\n"
            f"  RidgeFill: {' '.join(check['shown_answer'].split())}")


def sources_text(sources) -> str:
    """The answer's sources, best first: where each is and its passage on one line."""
    lines = ["Sources:"]
    for i, s in enumerate(sources, 1):
        where = s.document + (f", p. {s.page}" if s.page is not None else "") + f", characters {s.start:,}-{s.end:,}"
        lines.append(f"  {i}. {where} (score {s.score:.2f}): \"{' '.join(s.text.split())}\"")
    return "\n".join(lines)


def which_fit(engine, documents, question: str, room: int) -> str:
    """Which of the documents, taken in order, fit in `room` prompt tokens together."""
    fit = 0
    for k in range(1, len(documents) + 1):
        request = CompletionRequest(messages=document_messages(documents[:k], question))
        if len(engine.prompt_tokens(request)) > room:
            break
        fit = k
    names = ", ".join(d.name for d in documents[:fit])
    rest = ", ".join(d.name for d in documents[fit:])
    if fit == 0:
        return f"Not even the first document ({documents[0].name}) fits alone."
    return f"These documents fit together: {names}; these do not: {rest}."


def _keep_document(engine, cache, request, result, *, refine: bool, check: bool):
    """Save what the engine holds (and with `refine`, make it exact first, then save it again; with
    `check`, check the answer against exact's in between)."""
    work = IdleWork(engine, cache, refine=refine, check=check)
    work.after_completion(request, result)
    work.run()
    return work.status()
