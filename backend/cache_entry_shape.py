"""What a saved prompt-cache entry's header, row record and split streams must look like
(backend/prompt_cache.py): each check returns what is wrong ("" when nothing), so a reader can trust every
field's type before it uses one."""
from __future__ import annotations

import numpy as np

FORMAT = 1
MAX_TOKEN = 2**31  # token ids are int32 (prompt_cache.entry_name)


def is_count(x) -> bool:
    return type(x) is int and x >= 0  # not bool, not float


def record_problem(r) -> str:
    """What is wrong with a row record's shape ("" when nothing): tokens a list of token ids, approximated
    ordered runs [start, end, tag] inside the record after its clean rows, n_clean and stream_split counts."""
    if not isinstance(r, dict):
        return "the row record is not a JSON object"
    tokens = r.get("tokens")
    if not isinstance(tokens, list) or not all(type(t) is int and 0 <= t < MAX_TOKEN for t in tokens):
        return "its tokens are not a list of token ids"
    n, n_clean, runs = len(tokens), r.get("n_clean"), r.get("approximated")
    if not is_count(n_clean) or n_clean > n or not isinstance(runs, list):
        return f"its clean rows ({str(n_clean)[:20]}) are not a count up to its {n} rows, or its runs not a list"
    at = n_clean
    for run in runs:
        if not (isinstance(run, list) and len(run) == 3 and is_count(run[0]) and is_count(run[1])
                and isinstance(run[2], str) and at <= run[0] < run[1] <= n):
            return f"an approximated run {str(run)[:60]} does not fit rows {at}..{n}"
        at = run[1]
    if r.get("stream_split") is not None and not is_count(r["stream_split"]):
        return "its stream split is not a count"
    return ""


def header_problem(h) -> str:
    """What is wrong with a header's shape ("" when nothing), so callers can trust every field's type."""
    if not isinstance(h, dict):
        return "the header is not a JSON object"
    if h.get("format") != FORMAT:
        return f"the header has format {str(h.get('format'))[:20]}, this version reads {FORMAT}"
    build = h.get("build") if isinstance(h.get("build"), dict) else {}
    for key, ok in [(k, isinstance(h.get(k), str)) for k in ("model_key", "model_name", "state_sha256")] + \
            [(f"build's {k}", isinstance(build.get(k), str)) for k in ("llama_cpp", "state_mark")] + \
            [(k, is_count(h.get(k))) for k in ("n_tokens", "exact_rows", "clean_rows", "state_bytes")]:
        if not ok:
            return f"its {key} is missing or of the wrong type"
    if ("streams_bytes" in h or "streams_sha256" in h) and not (
            is_count(h.get("streams_bytes")) and isinstance(h.get("streams_sha256"), str)):
        return "its streams' size or sha256 is malformed"
    return record_problem(h.get("record"))


def arrays_problem(arrays: dict, record: dict) -> str:
    """What is wrong with the split streams kept for `record` ("" when nothing): from_saved indexes with them."""
    if arrays and set(arrays) != {"stream_rows", "streams"}:
        return f"the split streams hold {sorted(arrays)[:4]}, not stream_rows and streams"
    if not arrays:
        return ""
    kept, h = arrays["stream_rows"], arrays["streams"]
    if kept.ndim != 1 or kept.dtype.kind not in "iu" or h.ndim != 2 or h.dtype != np.float32 or len(h) != len(kept):
        return f"the split streams' shapes do not fit ({kept.dtype}{kept.shape}, {h.dtype}{h.shape})"
    n = len(record["tokens"])
    if record.get("stream_split") is None or (len(kept) and not 0 <= int(kept.min()) <= int(kept.max()) < n):
        return "the split streams do not fit the row record"
    return ""
