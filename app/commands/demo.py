"""`python -m app demo`: the headless main job. A real document the app ships (Valgrind's FAQ), one
question, answered by RidgeFill (as switched on: its default mode, split and tail) and by the exact model on the same
prompt, each scored on its claim, with both times to first token."""
from __future__ import annotations

from app.commands.common import format_timings, open_engine, stderr_progress
from backend.answers import answers_agree
from backend.completion import complete
from backend.demo import demo_document, demo_question, demo_right
from backend.documents import document_messages
from backend.protocol import CompletionRequest
from backend.ridgefill.defaults import switched_on_mode


def register(sub) -> None:
    p = sub.add_parser("demo", help="headless demo: a real document, one question, RidgeFill vs exact")
    p.add_argument("--tokens", type=int, default=None,
                   help="cut the document to about this many tokens around the answer (default: whole)")
    p.set_defaults(func=run)


def run(args) -> int:
    engine = open_engine(args)
    doc = demo_document(lambda s: engine.tokenize(s, add_special=False), n_tokens=args.tokens)
    question = demo_question()
    print(f"Model: {engine.info.name} ({engine.info.architecture}, {engine.info.n_layer} layers), "
          f"{engine.config.n_threads} threads")
    print(f"Document: {doc.name} (Valgrind 3.19.0's FAQ, GPL-2.0+), {doc.n_tokens:,} tokens; "
          f"the answer is {doc.answer_depth:.0%} of the way in.")
    print(f"Question: {question.question}\n")
    messages = document_messages(doc.text, question.question)
    # RidgeFill's one-time set-up (graph layout probe, late-layer K/V weights) is paid here, not in a TTFT.
    from backend.ridgefill.runtime import warm_up

    warm_up(engine)
    results, ridgefill_mode = {}, switched_on_mode(engine.info)
    # RidgeFill as it runs switched on (a model measured to run exact by default says why, below), then exact
    for mode in (ridgefill_mode, "off"):
        # greedy (the request's default): the two answers differ only by the prefill, never by a draw
        request = CompletionRequest(messages=messages, max_tokens=24, mode=mode, reuse_prefix=False)
        progress = stderr_progress("exact" if mode == "off" else "RidgeFill")
        result = results[mode] = complete(engine, request, on_event=progress)
        ran = result.timings.mode  # the model's own mode, as the planner resolved it; "off" when it ran exact
        label = "Exact model" if mode == "off" else f"RidgeFill ({ran if ran != 'off' else 'ran exact, see below'})"
        verdict = "correct" if demo_right(result.text) else f"wrong, expected {question.answers[0]}"
        print(f"{label} answers ({verdict}): {result.text.strip()}")
        print(format_timings(result.timings) + "\n")
    fast, exact = results[ridgefill_mode].timings, results["off"].timings
    same = answers_agree(results[ridgefill_mode].text, results["off"].text)
    print(f"Time to first token: RidgeFill {fast.ttft_ms:,.0f} ms vs exact {exact.ttft_ms:,.0f} ms "
          f"({exact.ttft_ms / fast.ttft_ms:.2f}x); the answers {'agree' if same else 'differ'}.")
    return 0
