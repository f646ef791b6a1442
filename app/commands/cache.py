"""`python -m app cache list [--json] | clear`: the prompt cache on disk (backend/prompt_cache.py);
`python -m lab cache bench` (lab/commands/cache_bench.py) measures it."""
from __future__ import annotations

import json

from backend.prompt_cache import PromptCache


def register(sub) -> None:
    p = sub.add_parser("cache", help="the prompt cache: documents prefilled once, kept on disk")
    actions = p.add_subparsers(dest="cache_action", metavar="ACTION", required=True)
    ls = actions.add_parser("list", help="the saved prompts, most recently used first")
    ls.add_argument("--json", action="store_true", help='print {"entries": [...]} as JSON')
    ls.set_defaults(func=run_list)
    clear = actions.add_parser("clear", help="remove every saved prompt")
    clear.set_defaults(func=run_clear)


def run_list(args) -> int:
    cache = PromptCache()
    entries = [e.as_dict() for e in cache.entries()]
    if args.json:
        print(json.dumps({"entries": entries}))
        return 0
    if not entries:
        print(f"no saved prompts in {cache.root}")
    for e in entries:
        share = e["exact_rows"] / e["tokens"] if e["tokens"] else 1.0
        print(f"{e['model']}: {e['tokens']:,} tokens, {share:.0%} exact, {e['bytes'] / 1e6:,.1f} MB, "
              f"last used {e['last_used']}")
    return 0


def run_clear(args) -> int:
    n = PromptCache().clear()
    print(f"removed {n} saved prompt{'s' if n != 1 else ''}")
    return 0
