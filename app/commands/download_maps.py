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
    from backend.hub.maps_hub import obtain_maps
    from backend.model_file import read_model_info
    from backend.ridgefill.defaults import default_split

    settings, entry, path = chosen_model(args)
    if path is None:
        raise HubError(f"{entry.id} is not installed; maps are checked against the model. "
                       f"Run `python -m app download {entry.id}` first.")
    split = args.split if args.split is not None else default_split(read_model_info(path))
    job = DownloadJob(f"maps {entry.id} split {split}", on_event=progress_printer(f"maps {entry.id}"))
    folder, how = obtain_maps(entry, split, path, settings, job, fit_if_missing=args.fit_if_missing,
                              on_fit_progress=_fit_progress)
    if how == "fitted":
        print(f"maps {entry.id}: fitted locally (no published set)", file=sys.stderr)
    print(folder)
    return 0


def _fit_progress(stage: str, done: int, total: int) -> None:
    if sys.stderr is not None and sys.stderr.isatty():
        print(f"\r  fit maps: {stage} {done}/{total}", end="" if done < total else "\n", file=sys.stderr)
