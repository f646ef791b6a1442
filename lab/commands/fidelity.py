"""`python -m lab fidelity`: how far RidgeFill moves the exact model's own answers about a document.

  python -m lab fidelity --doc manual.pdf --questions q.json [--modes guided,speed,q8] [--json]
  python -m lab fidelity --half judge --out long.jsonl        # the shipped long set (4K-32K documents)

q.json is a list of {"question": ..., "answer": ... (optional)}. Per setting: the mean ΔNLL of exact's
replies under its cache with a 95% CI, beside q8 (llama.cpp's q8_0 K/V cache: the yardstick) and mb128
(exact at micro-batch 128: rounding); the replies whose first sentence changed; accuracy where answers
are given. Resumable JSON lines (--out).
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from app.commands.common import model_path, open_engine, str_list
from backend.documents import read_document_parts
from backend.errors import DocumentError
from backend.recall.report import p_value, table
from backend.user_paths import data_dir
from lab.commands.common import ridgefill_mode, say
from backend.tuning.fidelity import FidelityRun, parse_setting
from backend.tuning.fidelity_report import WITHIN, YARDSTICK, exact_accuracy, per_document, report
from backend.tuning.question_files import CHOOSE, JUDGE, QuestionedDocument, long_set, read_question_file


def default_settings(args) -> list[str]:
    """The model's default mode (at its default split; RidgeFill as switched on where the model runs exact by
    default) beside q8_0's cache: what the app runs, and the yardstick."""
    from backend.model_file import read_model_header

    return [ridgefill_mode(read_model_header(model_path(args)), None), "q8"]


def register(sub) -> None:
    p = sub.add_parser("fidelity", help="how far RidgeFill moves exact's answers about a document (ΔNLL, changed replies, accuracy)")
    p.add_argument("--doc", action="append", default=[], metavar="FILE", help="a document (repeatable, each with --questions)")
    p.add_argument("--questions", action="append", default=[], metavar="Q.json",
                   help="its questions: [{\"question\": ..., \"answer\": ... (optional)}]")
    p.add_argument("--half", choices=[CHOOSE, JUDGE], help="without --doc: only this half of the long set")
    p.add_argument("--documents", type=str_list, default=None, help="without --doc: only these long-set documents")
    p.add_argument("--modes", type=str_list, default=None,
                   help="settings beside exact: guided, guided:SPLIT, speed, speed:SPLIT, q8, mb128 (default: the "
                        "model's default mode, or as switched on where it runs exact, and q8)")
    p.add_argument("--every", type=int, default=1, metavar="K", help="only every K-th question of each document (a sample spread over it)")
    p.add_argument("--tail", type=int, default=None, help="exact tail T (default: the model's)")
    p.add_argument("--out", default=None, help="JSON lines file (default: <data dir>/evals/fidelity.jsonl); resumed")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(func=run)


def documents(args) -> list[QuestionedDocument]:
    if not args.doc:
        docs = long_set(args.half)
        if args.documents:
            docs = [d for d in docs if d.name in args.documents or Path(d.name).stem in args.documents]
        if not docs:
            raise DocumentError("no long-set document matches --documents")
        return docs
    if len(args.doc) != len(args.questions):
        raise DocumentError("give one --questions file for each --doc, in the same order")
    out = []
    for doc, questions in zip(args.doc, args.questions):
        text = read_document_parts(Path(doc)).text
        out.append(QuestionedDocument(Path(doc).name, text, read_question_file(questions, Path(doc).name)))
    return out


def run(args) -> int:
    settings = [parse_setting(s) for s in (args.modes or default_settings(args))]
    docs = documents(args)
    if args.every > 1:
        docs = [replace(d, questions=d.questions[:: args.every]) for d in docs]
    engines: dict = {}

    def engine_for(setting):
        if setting.engine_key not in engines:
            engines[setting.engine_key] = _engine(args, setting)
        return engines[setting.engine_key]

    out = args.out or str(data_dir() / "evals" / "fidelity.jsonl")
    n = sum(len(d.questions) for d in docs)
    say(f"{n} questions about {len(docs)} documents; exact and {', '.join(s.name for s in settings)}; results -> {out}")
    runner = FidelityRun(engine_for, Path(model_path(args)).name, out, tail=args.tail, on_line=_progress,
                         plan_for=getattr(args, "plan_for", None))
    try:
        lines = runner.run(docs, settings)
    finally:
        for engine in engines.values():
            engine.close()
    figures = {"exact": exact_accuracy(lines), "settings": report(lines),
               "documents": {s.name: per_document(lines, s.name) for s in settings if s.name != YARDSTICK}}
    print(json.dumps(figures, indent=1) if args.json else fidelity_text(figures))
    return 0


def _engine(args, setting):
    engine = open_engine(args, swa_full=True)
    if setting.engine_key == ("f16", engine.config.n_ubatch):
        return engine
    config = replace(engine.config, kv_type=setting.kv_type, n_ubatch=setting.ubatch)
    engine.close()
    from backend.engine import Engine

    return Engine(config)


def _progress(r: dict) -> None:
    if "skipped" in r:
        say(f"{r['id']} {r['setting']}: skipped ({r['skipped']})")
        return
    right = "" if r.get("right") is None else (" right" if r["right"] else " wrong")
    nll = "-" if r.get("nll_ref") is None else f"{r['nll_ref']:.3f}"
    say(f"{r['id']} {r['setting']}: {r['reply'].strip()[:50]!r}{right}, NLL(exact's reply) {nll}, "
        f"{r['seconds']:.1f} s" + (f"  [{r['note']}]" if r.get("note") else ""))


def fidelity_text(figures: dict) -> str:
    e = figures["exact"]
    out = [f"exact: {e['right']} of {e['n']} right" + (f" ({e['skipped']} beyond the context)" if e["skipped"] else "")]
    for setting, groups in figures["settings"].items():
        rows = [_row(group, g) for group, g in groups.items()]
        out += ["", f"{setting} against exact (ΔNLL: nats per token of exact's reply; right: claim in the first sentence)",
                table(["group", "n", "ΔNLL", "95% CI", "mean |ΔNLL|", "changed", "right / exact's", "kept", "p"], rows)]
    for setting, docs in figures.get("documents", {}).items():
        out += ["", *_document_lines(setting, docs, figures["settings"][setting]["all"])]
    return "\n".join(out)


def _document_lines(setting: str, docs: list[dict], overall: dict) -> list[str]:
    """Per document against the yardstick, worst first, and the worst beside the overall mean."""
    if not docs:
        return [f"{setting}: no document has q8 beside it (add q8 to --modes to judge per document)"]
    rows = [[d["document"], d["n"], f"{d['dnll']:+.3f}", f"{d['q8_abs']:.3f}", f"{d['ratio']:.1f}×",
             "yes" if d["within"] else "NO"] for d in docs]
    worst = docs[0]
    mean = f"{overall['dnll']:+.3f}" if "dnll" in overall else "-"
    return [f"{setting} per document (mean ΔNLL against q8_0's mean |ΔNLL| on the same questions; "
            f"within: at most {WITHIN:g}×)",
            table(["document", "n", "ΔNLL", "q8 |ΔNLL|", "ratio", "within"], rows),
            f"worst document: {worst['document']} at {worst['ratio']:.1f}× q8_0's (ΔNLL {worst['dnll']:+.3f}, "
            f"n = {worst['n']}); overall mean ΔNLL {mean}; {sum(d['within'] for d in docs)} of {len(docs)} documents within"]


def _row(group: str, g: dict) -> list:
    ci = f"[{g['dnll_lo']:+.3f}, {g['dnll_hi']:+.3f}]" if "dnll" in g else "-"
    right = f"{g['right']} / {g['exact_right']}" if "right" in g else "-"
    kept = f"{g['kept']}" + (f" (stable {g['stable_kept']}/{g['stable']})" if "stable" in g else "") if "kept" in g else "-"
    return [group, g["n"], f"{g['dnll']:+.3f}" if "dnll" in g else "-", ci,
            f"{g['abs_dnll']:.3f}" if "dnll" in g else "-", g["changed"], right, kept,
            p_value(g["p"]) if "p" in g else "-"]
