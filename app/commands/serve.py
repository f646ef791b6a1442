"""`python -m app serve`: the model on an OpenAI-compatible server (docs/SERVER.md)."""
from __future__ import annotations

import os
import signal

from app.commands.common import model_path
from app.commands.sampling_args import add_sampling_args, sampling_from_args, sampling_given
from app.engine_protocol import EngineSettings
from backend.protocol import MODES
KEY_VARIABLE = "RIDGEFILL_API_KEY"


def register(sub) -> None:
    from app.server.api import DEFAULT_MAX_QUEUE, DEFAULT_QUEUE_TIMEOUT_S
    from app.server.runner import DEFAULT_HOST, DEFAULT_PORT
    from backend.protocol import DEFAULT_MAX_TOKENS

    p = sub.add_parser("serve", help="serve the model with the OpenAI API on localhost (docs/SERVER.md)")
    p.add_argument("--host", default=DEFAULT_HOST,
                   help=f"address to listen on (default {DEFAULT_HOST}; any other needs --api-key)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    p.add_argument("--api-key", default=os.environ.get(KEY_VARIABLE) or None,
                   help=f"require 'Authorization: Bearer KEY' (default: the {KEY_VARIABLE} variable; none)")
    p.add_argument("--mode", default=None, choices=MODES,
                   help="RidgeFill mode of a request that names none (default: the model's)")
    p.add_argument("--split", type=int, default=None, help="default split S (default: the model's)")
    p.add_argument("--tail", type=int, default=None, help="default exact tail T (default: the model's)")
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
                   help=f"answer length of a request that gives none (default {DEFAULT_MAX_TOKENS})")
    p.add_argument("--max-queue", type=int, default=DEFAULT_MAX_QUEUE,
                   help=f"requests waiting or running at once; more get 429 (default {DEFAULT_MAX_QUEUE})")
    p.add_argument("--queue-timeout", type=float, default=DEFAULT_QUEUE_TIMEOUT_S, metavar="SECONDS",
                   help="a request the engine has not started on within this gets 503 (default "
                        f"{DEFAULT_QUEUE_TIMEOUT_S:.0f})")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="answer requests for this Host name too (default: loopback names and --host); repeatable")
    p.add_argument("--allowed-origin", action="append", default=[], metavar="ORIGIN",
                   help="let web pages of this origin (e.g. http://localhost:3000, or *) call the server; "
                        "other pages get 403 (default none); repeatable")
    add_sampling_args(p)  # the sampling of a request that leaves it out
    p.set_defaults(func=run)


def engine_settings(args) -> EngineSettings:
    """The model, context and threads from the command line; the user cache and the prompt cache from the
    saved settings, as the window's engine has them, so that a window and `serve` share one cache."""
    from app.settings import Settings

    saved = Settings.load()
    return EngineSettings(model_path=model_path(args), n_ctx=args.ctx, n_threads=args.threads,
                          cache_root=saved.cache_location or None, prompt_cache=saved.prompt_cache_gb > 0,
                          cache_limit_bytes=saved.prompt_cache_bytes())


def run(args) -> int:
    from app.server.gateway import ProcessGateway
    from app.server.runner import LocalServer, check_bind
    from app.server.schema import Defaults

    check_bind(args.host, args.api_key)  # before minutes of loading, not after
    # SIGTERM (a service manager's stop) takes Ctrl-C's path: uvicorn finishes its shutdown and raises the
    # signal again, which then arrives as KeyboardInterrupt, so the gateway below closes the engine child.
    previous_term = signal.signal(signal.SIGTERM, signal.default_int_handler)
    # Ctrl-C in the terminal reaches the whole process group: the engine child ignores it (the disposition
    # is inherited) and stops when the server, having finished its shutdown, closes the gateway.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        gateway = ProcessGateway(engine_settings(args)).start()
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        print("Loading the model…", flush=True)
        info = gateway.wait_ready()
        sampling = sampling_from_args(args, info.sampling) if sampling_given(args) else None
        server = LocalServer(gateway, defaults=Defaults(args.mode, args.split, args.tail, args.max_tokens, sampling),
                             host=args.host, port=args.port, api_key=args.api_key, max_queue=args.max_queue,
                             extra_hosts=tuple(args.allowed_host), origins=tuple(args.allowed_origin),
                             queue_timeout_s=args.queue_timeout)
        from app.server.api import model_id

        print(f"Serving {model_id(info)} ({info.n_layer} layers, context {info.n_ctx:,}) with the OpenAI API at "
              f"{server.url}/v1\n  default RidgeFill mode {args.mode}, split "
              f"{info.default_split if args.split is None else args.split}, tail "
              f"{info.default_tail if args.tail is None else args.tail}; "
              f"{'a key is required' if args.api_key else 'no key'}; one request at a time, in arrival order. "
              "Ctrl-C stops.", flush=True)
        server.serve_forever()
    finally:
        gateway.close()
        signal.signal(signal.SIGTERM, previous_term)
    return 0
