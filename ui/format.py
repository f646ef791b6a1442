"""Plain-text formatting of timings and counts for the widgets (no Qt, easy to test)."""
from __future__ import annotations

from backend.answers import answers_agree


def ms(v: float) -> str:
    return f"{v / 1000:.2f} s" if v >= 1000 else f"{v:,.0f} ms"


def timings_line(t: dict) -> str:
    if t.get("engine"):
        return remote_line(t)
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


def remote_line(t: dict) -> str:
    """A server's answer (app/remote_engine.py): who answered, the TTFT and speed measured here, then the
    server's own timings as it sent them (none: said so), RidgeFill's mode on this app's server."""
    line = (f"answered by {t['engine']} · TTFT {ms(t.get('ttft_ms', 0))} (measured here) · answer "
            f"{t.get('predicted_n', 0):,} tok @ {t.get('predicted_per_second', 0):,.1f} tok/s")
    s = t.get("server")
    if not s:
        line += "\nserver sent no timings"
    else:
        line += (f"\nserver: prompt {s.get('prompt_n', 0):,} tok in {ms(s.get('prompt_ms', 0))}"
                 + (f" ({s['cache_n']:,} reused)" if s.get("cache_n") else "")
                 + f" · answer {s.get('predicted_n', 0):,} tok @ {s.get('predicted_per_second', 0):,.1f} tok/s")
        if "bulk_n" in s:  # this app's server: the mode that ran
            line += " · " + ("exact" if s.get("mode", "off") == "off"
                             else f"{s['mode']} S={s.get('split')} T={s.get('tail')} bulk {s.get('bulk_n', 0):,}")
    if t.get("sources_note"):
        line += f" · {t['sources_note']}"
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


# The embedded models answer one long-document question in six (Gemma 3 270M) or none (SmolLM2)
# (docs/LONG_DOCUMENTS.md#the-default-model-on-the-long-set): the window says what they are for.
EMBEDDED_NOTE = (" · an embedded model, for trying the app: Models & maps recommends one that reads "
                 "documents better on this machine")


def engine_ready_line(info, embedded: bool) -> str:
    """The status line of a loaded engine (app.engine_protocol.EngineReady); `embedded`: its model is the
    embedded one."""
    return (f"Engine ready: {info.model_name} ({info.architecture}, {info.n_layer} layers, context "
            f"{info.n_ctx:,}) · loaded in {info.load_s:.1f} s · process {info.pid}"
            + (EMBEDDED_NOTE if embedded else ""))


def check_line(check: dict) -> str:
    """Under a RidgeFill answer, once the engine checked it against exact's (backend/answer_check.py)."""
    if check.get("verdict") == "checked":
        if answers_agree(str(check.get("exact_answer", "")), str(check.get("shown_answer", ""))):
            return "✓ checked against the exact model: it gives the same answer"
        return ("✓ checked against the exact model: it finds this answer as likely as its own, which reads: "
                + " ".join(str(check.get("exact_answer", "")).split()))
    shown = " ".join(str(check.get("shown_answer", "")).split())
    return ("✗ corrected: the exact model answers otherwise, and its answer is shown above.\n"
            f"RidgeFill's first answer was: {shown}")


def message_lines(m) -> tuple[str, str]:
    """An answer's lines under it (app/conversations.Message): its timings and note, and how it stands
    beside exact's (the comparison run's answer, else the check's verdict; "" for neither)."""
    meta = timings_line(m.timings) if m.timings else ""
    note = m.note or ("" if m.complete else "(answer interrupted)")
    beside_exact = check_line(m.check) if m.check else ""
    if m.exact:
        agree = answers_agree(m.content, m.exact.get("content", ""))
        beside_exact = (compare_line(m.timings or {}, m.exact.get("timings", {}), agree)
                        + ("" if agree else f"\nExact answer: {m.exact.get('content', '').strip()}"))
    return "\n".join(x for x in (meta, note) if x), beside_exact

