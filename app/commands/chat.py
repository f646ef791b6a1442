"""`python -m app chat --doc FILE "question"`: answer a question about a text file, with timings."""
from __future__ import annotations

import json
import sys

from app.commands.common import format_timings, open_engine, stderr_progress
from app.commands.sampling_args import add_sampling_args, sampling_from_args
from backend.completion import complete
from backend.documents import document_messages, read_document
from backend.idle_work import IdleWork
from backend.prompt_cache import PromptCache
from backend.protocol import DEFAULT_MAX_TOKENS, MODES, ChatMessage, CompletionRequest, TokenEvent
from backend.ridgefill.defaults import default_mode
from backend.stopping import LOOP_NOTE


def register(sub) -> None:
    p = sub.add_parser("chat", help="ask a question, optionally about a document")
    p.add_argument("question")
    p.add_argument("--doc", help="a document to ask about: .txt, .md, .pdf, .docx, .html, .epub or .odt")
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
    p.set_defaults(func=run)


def run(args) -> int:
    if args.doc:
        messages = document_messages(read_document(args.doc), args.question)
    else:
        messages = [ChatMessage("user", args.question)]
    engine = open_engine(args)
    # As in the GUI: the app's RidgeFill mode, the model's sampling, a loop stopped
    request = CompletionRequest(
        messages=messages, max_tokens=args.max_tokens, mode=args.mode or default_mode(engine.info),
        split=args.split, tail=args.tail, sampling=sampling_from_args(args, engine.info.sampling),
        stop=args.stop, stop_loops=True,
    )
    progress = stderr_progress()
    stream = not args.json and sys.stdout.isatty()

    def on_event(event) -> None:
        progress(event)
        if stream and isinstance(event, TokenEvent):
            print(event.text, end="", flush=True)

    cache = None if args.no_cache else PromptCache()
    result = complete(engine, request, on_event=on_event, prompt_cache=cache)
    document = _keep_document(engine, cache, args.refine)
    if args.json:
        print(json.dumps({"answer": result.text, "finish_reason": result.finish_reason,
                          "prompt_tokens": result.prompt_tokens, "timings": result.timings.as_dict(),
                          "document": document.as_dict()}))
        return 0
    print(("" if stream else result.text) + "\n")
    print(format_timings(result.timings))
    if result.finish_reason == "loop":
        print(f"  {LOOP_NOTE}")
    if document.tokens:
        saved = "saved" if document.saved else "not saved"
        print(f"  {'prompt cache':<20} {document.line()}, {saved}" + (f" ({document.note})" if document.note else ""))
    return 0


def _keep_document(engine, cache, refine: bool):
    """Save what the engine holds (and with `refine`, make it exact first, then save it again)."""
    work = IdleWork(engine, cache, refine=refine)
    work.after_completion()
    work.run()
    return work.status()
