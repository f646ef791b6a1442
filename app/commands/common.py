"""What several commands share: opening the engine, comma-separated list arguments, printing timings,
progress on stderr."""
from __future__ import annotations

import argparse
import sys

from backend.embedded_models import embedded_model_path
from backend.engine import Engine, EngineConfig
from backend.protocol import ProgressEvent, Timings
from backend.ridgefill.runtime import attach


def model_path(args) -> str:
    return str(args.model or embedded_model_path())


def open_engine(args, *, swa_full: bool = True) -> Engine:
    cfg = EngineConfig(model_path=model_path(args), n_ctx=args.ctx, swa_full=swa_full,
                       gpu_layers=getattr(args, "gpu_layers", "auto"))
    if args.threads:
        cfg.n_threads = args.threads
    engine = Engine(cfg)
    attach(engine)  # built whole: RidgeFill's runtime made with the context, so no request's planning decodes
    return engine


def int_list(text: str) -> list[int]:
    try:
        return [int(x.replace("_", "")) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def float_list(text: str) -> list[float]:
    try:
        out = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if any(not 0.0 <= d <= 1.0 for d in out):
        raise argparse.ArgumentTypeError("depths are shares of the haystack, between 0 and 1")
    return out


def str_list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def stderr_progress(label: str = "prefill"):
    """An on_event sink that draws prefill progress on stderr (only when it is a terminal)."""
    tty = sys.stderr is not None and sys.stderr.isatty()

    def sink(event) -> None:
        if tty and isinstance(event, ProgressEvent):
            rate = event.done / (event.elapsed_ms / 1000) if event.elapsed_ms else 0.0
            print(f"\r{label}: {event.done}/{event.total} tokens  {rate:,.0f} tok/s", end="", file=sys.stderr)
            if event.done == event.total:
                print(file=sys.stderr)

    return sink


def stage_printer():
    """on_progress(stage, done, total) for capture/fit/tune: done/total, rate and time left on stderr
    (one redrawn line on a terminal; otherwise a line per stage change and about every 10%)."""
    from backend.eta import Eta

    eta = Eta()
    tty = sys.stderr is not None and sys.stderr.isatty()
    last = {"stage": None, "tenth": -1}

    def on_progress(stage: str, done: int, total: int) -> None:
        eta.update(stage, done, total)
        tenth = int(10 * done / total) if total else 0
        if tty:
            print(f"\r{eta.line()}   ", end="\n" if done >= total else "", file=sys.stderr, flush=True)
        elif stage != last["stage"] or tenth != last["tenth"]:
            print(eta.line(), file=sys.stderr, flush=True)
        last.update(stage=stage, tenth=tenth)

    return on_progress


def say_note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def format_timings(t: Timings) -> str:
    rows = [
        ("mode", t.mode + (f"  (split {t.split}, tail {t.tail}, bulk rows {t.bulk_n}"
                      + (f", {t.exact_n} of them exact" if t.exact_n else "") + ")" if t.mode != "off" else "")),
        ("time to first token", f"{t.ttft_ms:,.0f} ms"),
        ("prompt", f"{t.prompt_n:,} tokens in {t.prompt_ms:,.0f} ms ({t.prompt_per_second:,.1f} tok/s), {t.cache_n:,} reused"),
        ("answer", f"{t.predicted_n:,} tokens in {t.predicted_ms:,.0f} ms ({t.predicted_per_second:,.1f} tok/s)"),
    ]
    if t.note:
        rows.append(("note", t.note))
    return "\n".join(f"  {k:<20} {v}" for k, v in rows)
