"""Two `sources` runs compared on the items both hold (docs/measurements/sources.md#sources-the-questions-rows-alone):
`paired_sources.py BEFORE.jsonl AFTER.jsonl`. Per mode and haystack: n, top and any of 3 before and
after, and the items whose hit changed either way."""
import json
import sys


def load(path):
    return {(r["id"], r["mode"]): r for r in map(json.loads, open(path))}


def main(before_path, after_path):
    before, after = load(before_path), load(after_path)
    groups = {}
    for key in sorted(before.keys() & after.keys()):
        b, a = before[key], after[key]
        for group in ((b["mode"], "all"), (b["mode"], b["haystack"])):
            groups.setdefault(group, []).append((b, a))
    print("| mode, haystack | n | top before → after | any of 3 before → after | top lost / gained "
          "| any lost / gained |")
    print("|---|---|---|---|---|---|")
    for (mode, haystack), pairs in sorted(groups.items()):
        def count(field, which):
            return sum(p[which][field] for p in pairs)

        def flips(field):
            lost = [b["id"] for b, a in pairs if b[field] and not a[field]]
            gained = [b["id"] for b, a in pairs if a[field] and not b[field]]
            return f"{len(lost)} / {len(gained)}"

        print(f"| {mode}, {haystack} | {len(pairs)} | {count('top', 0)} → {count('top', 1)} | "
              f"{count('any', 0)} → {count('any', 1)} | {flips('top')} | {flips('any')} |")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
