"""`python -m app demo`: the headless main job. A long bundled document, one question, answered by
RidgeFill (its default mode, split and tail) and by the exact model on the same prompt, with both times
to first token."""
from __future__ import annotations

from app.commands.common import format_timings, open_engine, stderr_progress
from backend.answers import answers_agree
from backend.completion import complete
from backend.demo import DEMO_ANSWER, DEMO_QUESTION, demo_document
from backend.documents import document_messages
from backend.protocol import CompletionRequest
from backend.ridgefill.defaults import DEFAULT_MODE


def register(sub) -> None:
    p = sub.add_parser("demo", help="headless demo: a long bundled document, one question, RidgeFill vs exact")
    p.add_argument("--tokens", type=int, default=4000, help="length of the demo document in tokens")
    p.set_defaults(func=run)


def run(args) -> int:
    engine = open_engine(args)
    doc = demo_document(lambda s: engine.tokenize(s, add_special=False), n_tokens=args.tokens)
    print(f"Model: {engine.info.name} ({engine.info.architecture}, {engine.info.n_layer} layers), "
          f"{engine.config.n_threads} threads")
    print(f"Document: {doc.n_tokens:,} tokens of the shipped corpus; a fact is buried at {doc.fact_depth:.0%}.")
    print(f"Question: {DEMO_QUESTION}\n")
    messages = document_messages(doc.text, DEMO_QUESTION)
    # RidgeFill's one-time set-up (graph layout probe, late-layer K/V weights) is paid here, not in a TTFT.
    from backend.ridgefill.runtime import warm_up

    warm_up(engine)
    results = {}
    for mode, label in ((DEFAULT_MODE, f"RidgeFill ({DEFAULT_MODE})"), ("off", "Exact model")):
        # greedy (the request's default): the two answers differ only by the prefill, never by a draw
        request = CompletionRequest(messages=messages, max_tokens=24, mode=mode, reuse_prefix=False)
        result = results[mode] = complete(engine, request, on_event=stderr_progress(mode))
        verdict = "correct" if DEMO_ANSWER in result.text else f"wrong, expected {DEMO_ANSWER}"
        print(f"{label} answers ({verdict}): {result.text.strip()}")
        print(format_timings(result.timings) + "\n")
    fast, exact = results[DEFAULT_MODE].timings, results["off"].timings
    same = answers_agree(results[DEFAULT_MODE].text, results["off"].text)
    print(f"Time to first token: RidgeFill {fast.ttft_ms:,.0f} ms vs exact {exact.ttft_ms:,.0f} ms "
          f"({exact.ttft_ms / fast.ttft_ms:.2f}x); the answers {'agree' if same else 'differ'}.")
    return 0
