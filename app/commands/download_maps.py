"""`python -m app download-maps MODEL [--split S]`: fetch a published map set, verify it against the
installed model, and put it where the engine looks (the user cache). A set that is not published
says how to fit one locally; a set that does not match the model is refused with the reason."""
from __future__ import annotations

import sys

from app.commands.download import add_hub_options, chosen_model, progress_printer
from backend.hub.errors import HubError
from backend.hub.jobs import DownloadJob


def register(sub) -> None:
    p = sub.add_parser("download-maps", help="download a model's RidgeFill map set from the hub, verified")
    p.add_argument("name", metavar="MODEL", help="a catalogue id (see `models`); the model must be installed")
    p.add_argument("--split", type=int, default=None, help="split S (default: the model's default split)")
    p.add_argument("--fit-if-missing", action="store_true",
                   help="when the hub has no such set (or offline), fit it locally instead (minutes on a CPU)")
    add_hub_options(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from app.commands.common import say_note, stage_printer
    from backend.hub.get_maps import get_maps
    from backend.hub.maps_hub import download_maps
    from backend.model_file import read_model_info
    from backend.ridgefill.defaults import split_or_default

    settings, entry, path = chosen_model(args)
    if path is None:
        raise HubError(f"{entry.id} is not installed; maps are checked against the model. "
                       f"Run `python -m app download {entry.id}` first.")
    split = split_or_default(read_model_info(path), args.split)
    printer = progress_printer(f"maps {entry.id}")
    if not args.fit_if_missing:  # the published set or a clear refusal that says how to fit one
        job = DownloadJob(f"maps {entry.id} split {split}", on_event=printer)
        folder = download_maps(entry, split, path, settings, job)
        print(folder)
        return 0
    # Get maps: cached, else published (downloaded, verified), else fitted here (backend/hub/get_maps.py)
    res = get_maps(path, split, settings, on_progress=stage_printer(), on_note=say_note, on_download=printer)
    print(f"maps {entry.id}: {res.how}" + (" locally (no published set)" if res.how == "fitted" else ""),
          file=sys.stderr)
    for w in res.warnings:
        print(f"maps {entry.id}: warning: {w}", file=sys.stderr)
    print(res.folder)
    return 0
