"""`python -m app demo`: the headless main job. A long bundled document, one question, the answer and timings."""
from __future__ import annotations

from app.commands.common import format_timings, open_engine, stderr_progress
from backend.demo import DEMO_ANSWER, DEMO_QUESTION, demo_document
from backend.documents import document_messages
from backend.protocol import CompletionRequest


def register(sub) -> None:
    p = sub.add_parser("demo", help="headless demo: a long bundled document, one question, answer and timings")
    p.add_argument("--tokens", type=int, default=4000, help="length of the demo document in tokens")
    p.set_defaults(func=run)


def run(args) -> int:
    engine = open_engine(args)
    doc = demo_document(lambda s: engine.tokenize(s, add_special=False), n_tokens=args.tokens)
    print(f"Model: {engine.info.name} ({engine.info.architecture}, {engine.info.n_layer} layers), "
          f"{engine.config.n_threads} threads")
    print(f"Document: {doc.n_tokens:,} tokens of the shipped corpus; a fact is buried at {doc.fact_depth:.0%}.")
    print(f"Question: {DEMO_QUESTION}\n")
    request = CompletionRequest(messages=document_messages(doc.text, DEMO_QUESTION), max_tokens=24)
    result = engine.complete(request, on_event=stderr_progress())
    verdict = "correct" if DEMO_ANSWER in result.text else f"wrong (expected {DEMO_ANSWER})"
    print(f"Answer ({verdict}): {result.text.strip()}\n")
    print("Exact model:")
    print(format_timings(result.timings))
    return 0
