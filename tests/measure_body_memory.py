"""The server's peak memory under many large request bodies at once (issue 55, item 7); run by hand, not a test:

    .venv/bin/python tests/measure_body_memory.py [--clients 64] [--mb 8] [--messages 1] [-- serve options]

Starts `python -m app serve --port 0` (the embedded model unless `--model` follows `--`), waits for it, then
C clients send at once a chat request of just under M MB each (its content split over `--messages` messages)
naming a model the server does not run, so the body is read and parsed in full and answered 404 without the
engine's work. Prints the server process's VmHWM (peak RSS) before and after, and the statuses."""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import time
from collections import Counter

CHUNK = 64 * 1024


def body_of(mb: float, messages: int) -> bytes:
    size = int(mb * 1024 * 1024) - 200 - 40 * messages  # the JSON around the text stays under the limit
    each = max(1, size // messages)
    msgs = [{"role": "user", "content": "a" * each} for _ in range(messages)]
    return json.dumps({"model": "not-this-one", "messages": msgs}).encode()


def vm(pid: int, key: str) -> int:
    """A /proc/<pid>/status figure in MB."""
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(rf"^{key}:\s+(\d+) kB", f.read(), re.M).group(1)) // 1024


async def one(port: int, body: bytes) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json"
                 f"\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode())
    try:
        view = memoryview(body)
        for i in range(0, len(body), CHUNK):  # in pieces, so the client's own memory stays small
            writer.write(view[i:i + CHUNK])
            await writer.drain()
        status = (await asyncio.wait_for(reader.readline(), 300)).decode().split(" ")[1:2]
        return status[0] if status else "no answer"
    except (ConnectionError, TimeoutError) as exc:
        return type(exc).__name__
    finally:
        writer.close()


async def load(port: int, clients: int, body: bytes) -> list[str]:
    return await asyncio.gather(*(one(port, body) for _ in range(clients)))


def main() -> int:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--mb", type=float, default=8.0)
    ap.add_argument("--messages", type=int, default=1)
    args = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    server = subprocess.Popen([sys.executable, "-m", "app", "serve", "--port", "0", *extra],
                              stdout=subprocess.PIPE, text=True)
    try:
        port = None
        for line in server.stdout:
            if m := re.search(r"http://127\.0\.0\.1:(\d+)/v1", line):
                port = int(m.group(1))
                break
        if port is None:
            print("the server did not start", file=sys.stderr)
            return 1
        body = body_of(args.mb, args.messages)
        before = vm(server.pid, "VmHWM")
        t0 = time.monotonic()
        statuses = asyncio.run(load(port, args.clients, body))
        print(json.dumps({"clients": args.clients, "body_bytes": len(body), "messages": args.messages,
                          "seconds": round(time.monotonic() - t0, 1), "statuses": Counter(statuses),
                          "vmhwm_mb_before": before, "vmhwm_mb_after": vm(server.pid, "VmHWM"),
                          "vmrss_mb_after": vm(server.pid, "VmRSS")}))
    finally:
        server.terminate()
        server.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
