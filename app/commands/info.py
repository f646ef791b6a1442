"""`python -m app info`: the model's shape and the machine's threads."""
from __future__ import annotations

import json
import os

from app.commands.common import model_path
from backend.gpu_offload import build_line
from backend.model_file import read_model_info
from backend.user_paths import cache_dir, data_dir, log_dir


def register(sub) -> None:
    p = sub.add_parser("info", help="print the model's architecture, layers, width, heads, context and threads")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args) -> int:
    info = read_model_info(model_path(args))
    facts = {
        "model": info.name,
        "file": info.path,
        "architecture": info.architecture,
        "layers": info.n_layer,
        "width": info.n_embd,
        "heads": info.n_head,
        "kv_heads": info.n_head_kv,
        "context_length": info.n_ctx_train,
        "size_mb": round(info.size_bytes / 1e6, 1),
        "threads": args.threads or os.cpu_count(),
        "gpu": build_line(),
        "data_dir": str(data_dir()),
        "cache_dir": str(cache_dir()),
        "log_dir": str(log_dir()),
    }
    if args.json:
        print(json.dumps(facts, indent=2))
    else:
        for k, v in facts.items():
            print(f"{k:<16} {v}")
    return 0
