"""`python -m lab serve-load`: a bounded load test of the OpenAI-compatible server (docs/SERVER.md)."""
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
                        "limit's 429 and the clients' retries are exercised too)")
    p.add_argument("--latency-repeats", type=int, default=5,
                   help="the started server: requests timed through HTTP and straight to the engine (0: skip)")
    p.add_argument("--hostile", action="store_true",
                   help="mix in hostile clients (oversized, NaN, deeply nested, cross-origin, rebound Host, "
                        "text/plain, disconnecting mid-stream, reading slowly or not at all): each must get its "
                        "4xx (or its 200), none a 5xx")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(func=run)


def load_with_hostile(url: str, args):
    """run_load, with the hostile clients on a thread beside it when asked: (report, hostile summary or None)."""
    import threading

    from lab.server_load.hostile import run_hostile
    from lab.server_load.load import health_when_idle, run_load

    stop, box = threading.Event(), {}
    thread = threading.Thread(target=lambda: box.update(h=run_hostile(url, stop)), name="hostile", daemon=True)
    if args.hostile:
        thread.start()
    try:
        report = run_load(url, clients=args.clients, requests=args.requests, max_tokens=args.max_tokens,
                          api_key=args.api_key)
    finally:
        stop.set()
    if not args.hostile:
        return report, None
    thread.join(660)  # a hostile client waits at most the server's queue deadline (600 s)
    report.health_after = health_when_idle(url, 60)  # again: the hostile clients ran on after the load's check
    return report, box["h"].summary() if "h" in box else {"sent": 0, "unfinished": True}


def run(args) -> int:
    from lab.server_load.load import added_latency, report_lines

    latency = hostile = None
    restarts = 0
    if args.url:
        report, hostile = load_with_hostile(args.url.rstrip("/"), args)
    else:
        from app.commands.serve import engine_settings
        from app.server.gateway import ProcessGateway
        from app.server.runner import LocalServer
        from app.server.schema import Defaults

        gateway = ProcessGateway(engine_settings(args)).start()
        try:
            pid = gateway.wait_ready().pid
            server = LocalServer(gateway, defaults=Defaults(), port=0, max_queue=args.max_queue).start()
            try:
                report, hostile = load_with_hostile(server.url, args)
                restarts = int(gateway.info is None or gateway.info.pid != pid)  # a request restarted the engine
                if args.latency_repeats > 0:
                    latency = added_latency(server.url, gateway, repeats=args.latency_repeats,
                                            max_tokens=args.max_tokens)
            finally:
                server.stop()
        finally:
            gateway.close()
    summary = report.summary()
    # every 5xx the server gave, to the load's clients and the hostile ones: the target is none
    server_errors = sum(o.status is not None and o.status >= 500 for o in report.outcomes)
    server_errors += (hostile or {}).get("server_errors", 0)
    if args.json:
        print(json.dumps({**summary, "added_latency": latency, "hostile": hostile, "engine_restarted": restarts,
                          "5xx": server_errors}, indent=1))
    else:
        print("\n".join(report_lines(summary, latency)))
        if hostile is not None:
            print(f"hostile clients: {hostile.get('sent')} sent, {hostile.get('as_expected')} got their 4xx (a "
                  f"disconnect: its 200, then cancelled), {hostile.get('turned_away_queue_full')} turned away by the "
                  f"full queue before their body was read (429 queue_full), unexpected "
                  f"{hostile.get('unexpected') or 'none'}; by status class {hostile.get('by_class')}; engine "
                  f"restarted: {'yes' if restarts else 'no'}")
        print(f"5xx: {server_errors}")
    bad = hostile is not None and (hostile.get("unexpected") or hostile.get("unfinished"))
    ok = summary["lost"] == 0 and summary["healthy_after"] and not bad and not restarts and not server_errors
    return 0 if ok else 1
