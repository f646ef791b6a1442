"""`python -m lab recall`: needle recall, exact against RidgeFill on the same items, resumable JSON lines.

Example: python -m lab recall --lengths 2048,4096 --depths 0.1,0.3,0.5 --variants single,multikey --out r.jsonl
"""
from __future__ import annotations

import json

from app.commands.common import float_list, int_list, open_engine, str_list
from backend.protocol import RIDGEFILL_MODES
from backend.recall.document_questions import QUESTION_SETS
from backend.recall.needles import VARIANTS
from backend.recall.run import run_recall
from backend.ridgefill.defaults import DEFAULT_MODE
from lab.commands.common import add_split_tail, eval_items, say, split_tail
from lab.evals.compare import accuracy, by_condition, compare, recall_records
from lab.evals.paired_questions import paired_questions
from lab.evals.report import accuracy_table, comparison_text, questions_text


def register(sub) -> None:
    p = sub.add_parser("recall", help="needle recall in the bulk and tail, exact vs RidgeFill (resumable)")
    p.add_argument("--lengths", type=int_list, default=[2048], help="prompt lengths in tokens, e.g. 2048,4096")
    p.add_argument("--depths", type=float_list, default=[0.1, 0.3, 0.5], help="needle depths (0..1), e.g. 0.1,0.5")
    p.add_argument("--variants", type=str_list, default=["single"], help=f"comma-separated: {','.join(VARIANTS)}")
    p.add_argument("--haystack", default="filler",
                   help="filler (default), corpus, ledger, a text file, licences (questions about real licence texts) "
                        "or realqa (questions about real READMEs and FAQs)")
    add_split_tail(p)
    p.add_argument("--modes", type=str_list, default=["off", DEFAULT_MODE], help=f"modes to run (default off,{DEFAULT_MODE}); guided+answer: guided with the asked "
                   "answer's rows made exact too (an oracle)")
    p.add_argument("--reps", type=int, default=1, help="items per length/depth/variant (different keys and values)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="JSON lines file; an existing one is resumed")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    engine = open_engine(args)
    split, tail = split_tail(args, engine.info)
    items = eval_items(engine, args.haystack, lengths=args.lengths, depths=args.depths, variants=args.variants,
                       reps=args.reps, seed=args.seed)
    say(f"{len(items)} items x {len(args.modes)} modes on {engine.info.name}; split {split}, tail {tail}; "
        f"results -> {args.out}")

    def progress(p):
        r = p.record
        if r is None:
            return
        note = f"  [{r['note']}]" if r.get("note") else ""
        say(f"[{p.done}/{p.total}] {r['id']} {r['mode']}: {'correct' if r['correct'] else 'wrong'} "
            f"({r['region']}, {r['seconds']:.1f} s, reply {r['reply'].strip()[:40]!r}){note}")

    results = run_recall(engine, items, args.modes, split, tail, args.out, on_progress=progress)
    print_summary(results, args.json)
    if args.haystack in QUESTION_SETS and not args.json:
        for mode in (m for m in args.modes if m in RIDGEFILL_MODES):
            print(f"\nExact against {mode} on the {args.haystack} questions, paired:")
            print(questions_text(paired_questions(results, args.haystack, mode), mode))
    return 0


def print_summary(records: list[dict], as_json: bool) -> None:
    conds = by_condition(recall_records(records))
    acc = {c: accuracy(rs) for c, rs in conds.items()}
    cmps = [compare(conds["off"], rs, "off", c) for c, rs in conds.items() if c != "off"] if "off" in conds else []
    if as_json:
        print(json.dumps({"accuracy": acc, "comparisons": cmps}, indent=1))
        return
    print(accuracy_table(acc))
    for c in cmps:
        print()
        print(comparison_text(c))
