"""`python -m lab nll`: ΔNLL of the last 512 tokens of long documents, RidgeFill minus exact, paired per
document, with a bootstrap 95% CI. Resumable JSON lines (--out)."""
from __future__ import annotations

import json

from app.commands.common import open_engine
from backend.recall.haystacks import file_haystack
from backend.recall.report import table
from backend.ridgefill.defaults import DEFAULT_MODE
from backend.user_paths import data_dir
from lab.commands.common import add_split_tail, say, split_tail
from lab.evals.nll import LAST_N, nll_documents, run_nll


def register(sub) -> None:
    p = sub.add_parser("nll", help="ΔNLL of the last 512 tokens of long documents, RidgeFill minus exact, with a CI")
    p.add_argument("--length", type=int, default=3072, help="document length in tokens (default 3072)")
    p.add_argument("--docs", type=int, default=6, help="documents (per --doc file, or from the shipped corpus)")
    p.add_argument("--doc", action="append", default=[], metavar="FILE", help="score windows of this text file (repeatable)")
    p.add_argument("--last-n", type=int, default=LAST_N, help="tokens scored at the end of each document")
    p.add_argument("--mode", default=DEFAULT_MODE, help=f"the mode compared with off (default {DEFAULT_MODE})")
    add_split_tail(p)
    p.add_argument("--out", default=None, help="JSON lines file (default: <data dir>/evals/nll.jsonl); resumed")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def documents(engine, args):
    if not args.doc:
        return nll_documents(engine, args.length, args.docs)
    return [d for f in args.doc for d in nll_documents(engine, args.length, args.docs, file_haystack(f))]


def run(args) -> int:
    engine = open_engine(args)
    split, tail = split_tail(args, engine.info)
    out = args.out or str(data_dir() / "evals" / "nll.jsonl")
    docs = documents(engine, args)
    say(f"{len(docs)} documents of {args.length} tokens, last {args.last_n} scored; {args.mode} split {split}, "
        f"tail {tail} vs off; results -> {out}")

    def progress(p):
        r = p.record
        say(f"[{p.done}/{p.total}] {r['id']} {r['mode']}: NLL {r['nll']:.4f} ({r['seconds']:.1f} s)"
            + (f"  [{r['note']}]" if r.get("note") else ""))

    summary = run_nll(engine, docs, args.mode, split, tail, out, last_n=args.last_n, on_progress=progress)
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    print(nll_text(summary))
    return 0


def nll_text(s: dict) -> str:
    rows = [[d["id"], f"{d['nll_off']:.4f}", f"{d['nll']:.4f}", f"{d['delta']:+.4f}", d["bulk_n"]] for d in s["docs"]]
    out = [table(["document", "NLL off", f"NLL {s['mode']}", "ΔNLL", "bulk rows"], rows)]
    if s["n_docs"]:
        out.append(f"ΔNLL ({s['mode']} S{s['split']} T{s['tail']} minus off), mean over {s['n_docs']} documents: "
                   f"{s['delta']:+.4f} nats/token, {int(100 * s['level'])}% bootstrap CI [{s['ci_lo']:+.4f}, {s['ci_hi']:+.4f}]")
    if s["approximated"] < s["n_docs"]:
        out.append(f"note: only {s['approximated']} of {s['n_docs']} documents were approximated"
                   + (f" ({'; '.join(s['notes'])})" if s["notes"] else ""))
    return "\n".join(out)
