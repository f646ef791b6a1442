"""`python -m app serve-load`: a bounded load test of the OpenAI-compatible server (docs/SERVER.md)."""
from __future__ import annotations

import json


def register(sub) -> None:
    p = sub.add_parser("serve-load", help="load-test the server: C clients x R short requests, then its health")
    p.add_argument("--url", help="a running server (default: start one here on a free loopback port)")
    p.add_argument("--api-key", default=None, help="the running server's key, if it has one")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=5, help="requests per client, one after the other")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--max-queue", type=int, default=6,
                   help="the started server's queue limit (default 6: fewer than the clients, so that the "
                        "limit's 503 is exercised too)")
    p.add_argument("--latency-repeats", type=int, default=5,
                   help="the started server: requests timed through HTTP and straight to the engine (0: skip)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from app.server.load import added_latency, report_lines, run_load

    latency = None
    if args.url:
        report = run_load(args.url.rstrip("/"), clients=args.clients, requests=args.requests,
                          max_tokens=args.max_tokens, api_key=args.api_key)
    else:
        from app.commands.serve import DEFAULT_MODE, engine_settings
        from app.server.gateway import ProcessGateway
        from app.server.runner import LocalServer
        from app.server.schema import Defaults

        gateway = ProcessGateway(engine_settings(args)).start()
        try:
            gateway.wait_ready()
            server = LocalServer(gateway, defaults=Defaults(DEFAULT_MODE), port=0, max_queue=args.max_queue).start()
            try:
                report = run_load(server.url, clients=args.clients, requests=args.requests, max_tokens=args.max_tokens)
                if args.latency_repeats > 0:
                    latency = added_latency(server.url, gateway, repeats=args.latency_repeats,
                                            max_tokens=args.max_tokens)
            finally:
                server.stop()
        finally:
            gateway.close()
    summary = report.summary()
    if args.json:
        print(json.dumps({**summary, "added_latency": latency}, indent=1))
    else:
        print("\n".join(report_lines(summary, latency)))
    return 0 if summary["lost"] == 0 and summary["healthy_after"] else 1
