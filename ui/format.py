"""Plain-text formatting of timings and counts for the widgets (no Qt, easy to test)."""
from __future__ import annotations


def ms(v: float) -> str:
    return f"{v / 1000:.2f} s" if v >= 1000 else f"{v:,.0f} ms"


def timings_line(t: dict) -> str:
    parts = [f"TTFT {ms(t.get('ttft_ms', 0))}"]
    prompt = f"prompt {t.get('prompt_n', 0):,} tok @ {t.get('prompt_per_second', 0):,.0f} tok/s"
    if t.get("cache_n"):
        prompt += f" ({t['cache_n']:,} reused)"
    parts.append(prompt)
    parts.append(f"answer {t.get('predicted_n', 0):,} tok @ {t.get('predicted_per_second', 0):,.1f} tok/s")
    mode = t.get("mode", "off")
    if mode == "off":
        parts.append("exact")
    else:
        parts.append(f"{mode} S={t.get('split')} T={t.get('tail')} bulk {t.get('bulk_n', 0):,}"
                     + (f" ({t['exact_n']:,} exact)" if t.get("exact_n") else ""))
    if t.get("sources_ms"):  # finding the sources, after the answer
        parts.append(f"sources {ms(t['sources_ms'])}")
    line = " · ".join(parts)
    if t.get("note"):
        line += f"\n{t['note']}"
    return line


def compare_line(primary: dict, exact: dict, agree: bool) -> str:
    p, e = primary.get("ttft_ms", 0), exact.get("ttft_ms", 0)
    ratio = e / p if p > 0 else 0.0
    mode = primary.get("mode", "off")
    who = f"RidgeFill ({mode})" if mode != "off" else "this answer (exact)"
    return (f"TTFT {who} {ms(p)} · exact {ms(e)} · exact/this {ratio:.2f}× · "
            + ("answers agree ✓" if agree else "answers differ ✗"))


def eta_line(done: int, total: int, rate: float, label: str = "prefill") -> str:
    eta = (total - done) / rate if rate > 0 else 0.0
    return f"{label}: {done:,} / {total:,} tokens · {rate:,.0f} tok/s · ETA {eta:,.0f} s"
