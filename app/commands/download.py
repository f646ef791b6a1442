"""`python -m app download MODEL`: download a catalogue model into the user cache, verified.

Also home of what the hub commands share: --endpoint/--token/--offline/--maps-owner, the settings
they make, and the progress bar drawn on stderr.
"""
from __future__ import annotations

import sys
import time

from backend.hub import store
from backend.hub.catalogue import find_entry, load_catalogue, user_models_file
from backend.hub.jobs import DownloadEvent, DownloadJob, State
from backend.hub.settings import DEFAULT_MAPS_OWNER, HubSettings
from backend.user_paths import cache_dir


def register(sub) -> None:
    p = sub.add_parser("download", help="download a model from the catalogue (or any hub GGUF) into the user cache")
    p.add_argument("name", metavar="MODEL", help="a catalogue id (see `models`), OWNER/REPO[:FILE.gguf] after `models --add`")
    add_hub_options(p)
    p.set_defaults(func=run)


def add_hub_options(p) -> None:
    p.add_argument("--endpoint", help="hub endpoint URL (default: settings, HF_ENDPOINT or huggingface.co)")
    p.add_argument("--token", help="hub token for private or gated repos (default: settings)")
    p.add_argument("--offline", action="store_true", help="never use the network; say what is and is not cached")
    p.add_argument("--maps-owner", default=None, help=f"hub user/org whose ridgefill-maps-* repos hold map sets (default {DEFAULT_MAPS_OWNER})")


def hub_settings(args) -> HubSettings:
    endpoint, token = args.endpoint, args.token
    if endpoint is None or token is None:
        try:  # the GUI's saved settings, when there are any
            from app.settings import Settings

            saved = Settings.load()
            endpoint = endpoint or saved.hub_endpoint or None
            token = token or saved.hub_token or None
        except Exception:
            pass
    from huggingface_hub import constants as hf_constants

    offline = args.offline or hf_constants.is_offline_mode()  # HF_HUB_OFFLINE=1 means offline here too
    return HubSettings(cache_root=cache_dir(), endpoint=endpoint, token=token, offline=offline,
                       maps_owner=args.maps_owner or DEFAULT_MAPS_OWNER)


def catalogue():
    return load_catalogue(user_models_file())


def chosen_model(args):
    """(hub settings, the catalogue entry named by args.name, its installed file or None)."""
    settings = hub_settings(args)
    entry = find_entry(args.name, catalogue())
    return settings, entry, store.model_path(entry, settings)


def progress_printer(label: str):
    """An on_event sink: a byte bar on a terminal, one line per state change otherwise."""
    tty = sys.stderr is not None and sys.stderr.isatty()
    last = {"state": None, "t": 0.0, "t_state": time.monotonic()}

    def sink(e: DownloadEvent) -> None:
        if e.state != last["state"]:
            if tty and last["state"] in (State.DOWNLOADING, State.VERIFYING):
                print(file=sys.stderr)
            last["state"] = e.state
            last["t_state"] = time.monotonic()
            extra = f": {e.reason}" if e.reason else (f" -> {e.path}" if e.path and e.state is State.READY else "")
            print(f"{label}: {e.state.value}{extra}", file=sys.stderr)
            if e.state is State.DOWNLOADING and e.fit:
                print(f"{label}: {e.fit}", file=sys.stderr)
            for w in e.warnings if e.state is State.READY else ():
                print(f"{label}: warning: {w}", file=sys.stderr)
            return
        now = time.monotonic()
        if not tty or (now - last["t"] < 0.1 and e.done != e.total):
            return
        last["t"] = now
        total = e.total or 0
        pct = 100 * e.done / total if total else 0.0
        width = 30
        bar = "#" * int(width * pct / 100) + "-" * (width - int(width * pct / 100))
        spent = now - last["t_state"]
        rate = e.done / spent / 1e6 if spent > 0 else 0.0
        verb = "hash" if e.state is State.VERIFYING else "get"
        print(f"\r  {verb} [{bar}] {pct:5.1f}%  {e.done / 1e6:,.1f}/{total / 1e6:,.1f} MB  {rate:,.1f} MB/s ",
              end="", file=sys.stderr)

    return sink


def run(args) -> int:
    from backend.hub.downloads import download_model

    settings, entry, _ = chosen_model(args)
    job = DownloadJob(entry.id, on_event=progress_printer(entry.id))
    path = download_model(entry, settings, job)  # a failure raises a HubError: message + exit 2
    print(path)
    return 0
