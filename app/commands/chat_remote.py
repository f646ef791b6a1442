"""`python -m app chat --server URL [--api-key K] [--doc FILE] "question"`: the question asked of an
OpenAI-compatible server (app/remote_engine.py) instead of the local engine; the answer, the time to first
token measured here, and the server's own timings where it sends them."""
from __future__ import annotations

import json
import sys

from app.commands.sampling_args import sampling_from_args, sampling_given
from app.remote_engine import RemoteEngine
from backend.documents import document_messages, read_documents
from backend.protocol import ChatMessage, CompletionRequest, TokenEvent


def run_remote(args) -> int:
    documents = read_documents(args.doc) if args.doc else None
    messages = document_messages(documents, args.question) if documents else [ChatMessage("user", args.question)]
    engine = RemoteEngine(args.server, args.api_key or "", args.server_model or "")
    info = engine.probe()
    # Left out, the mode, split, tail and sampling are the server's own defaults: only what was given is sent.
    request = CompletionRequest(messages=messages, max_tokens=args.max_tokens, mode=args.mode, split=args.split,
                                tail=args.tail, stop=args.stop, documents=documents,
                                sampling=sampling_from_args(args) if sampling_given(args) else None)
    if not info.ours and (args.mode or args.split is not None or args.tail is not None):
        print(f"note: {engine.server} is not a RidgeFill server: --mode, --split and --tail are not sent.",
              file=sys.stderr)
    stream = not args.json and sys.stdout.isatty()

    def on_event(event) -> None:
        if stream and isinstance(event, TokenEvent):
            print(event.text, end="", flush=True)

    result = engine.complete(request, on_event=on_event)
    server = result.extra.get("server")
    if args.json:
        print(json.dumps({"answer": result.text, "finish_reason": result.finish_reason, "engine": engine.name,
                          "ridgefill_server": info.ours, "timings": result.timings.as_dict(),
                          "server_timings": server, "sources": [s.as_dict() for s in result.sources]}))
        return 0
    print(("" if stream else result.text) + "\n")
    if result.sources:
        from app.commands.chat import sources_text

        print(sources_text(result.sources) + "\n")
    print("\n".join(f"  {k:<20} {v}" for k, v in remote_rows(engine, result, info.ours)))
    return 0


def remote_rows(engine: RemoteEngine, result, ours: bool) -> list[tuple[str, str]]:
    t, server = result.timings, result.extra.get("server")
    rows = [("engine", engine.name + (" (RidgeFill server)" if ours else "")),
            ("time to first token", f"{t.ttft_ms:,.0f} ms, measured here"),
            ("answer", f"{t.predicted_n:,} tokens at {t.predicted_per_second:,.1f} tok/s, measured here")]
    if server:
        rows.append(("server timings", f"prompt {server.get('prompt_n', 0):,} tokens in "
                     f"{server.get('prompt_ms', 0):,.0f} ms ({server.get('prompt_per_second', 0):,.1f} tok/s), "
                     f"{server.get('cache_n', 0) or 0:,} reused; answer {server.get('predicted_n', 0):,} tokens in "
                     f"{server.get('predicted_ms', 0):,.0f} ms"))
        if server.get("ttft_ms"):
            rows.append(("server TTFT", f"{server['ttft_ms']:,.0f} ms (client overhead "
                         f"{t.ttft_ms - server['ttft_ms']:,.0f} ms)"))
    else:
        rows.append(("server timings", "not sent by this server"))
    if ours:
        rows.append(("mode", t.mode + (f"  (split {t.split}, tail {t.tail}, bulk rows {t.bulk_n})"
                                       if t.mode != "off" else "")))
    else:
        rows.append(("RidgeFill, sources", "not available from this server"))
    return rows
