"""A tqdm class that huggingface_hub drives (`tqdm_class=`) and that reports bytes to a download job.

huggingface_hub creates one bar per file (unit "B") and calls `update(n)` for every chunk it writes;
after a dropped connection it resumes with a Range request and keeps the same bar, and if a server
ignores the range it calls `update(-resume_size)`. Raising from `update` stops the transfer between
chunks: that is how cancel works (the library deletes its temporary file on the way out).
"""
from __future__ import annotations

from typing import Callable

from tqdm.std import tqdm

from .errors import DownloadCancelled


def bridge_class(on_bytes: Callable[[int], None], cancelled: Callable[[], bool]) -> type[tqdm]:
    """A tqdm subclass, bound to one job, that draws nothing and forwards byte counts."""

    class _JobBar(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs.pop("name", None)  # only huggingface_hub's own tqdm takes `name`
            kwargs["disable"] = True
            self._bytes = kwargs.get("unit", "it") == "B"
            super().__init__(*args, **kwargs)
            if cancelled():
                raise DownloadCancelled("Download cancelled.")

        def update(self, n=1):
            if cancelled():
                raise DownloadCancelled("Download cancelled.")
            if self._bytes and n:
                on_bytes(int(n))
            return None

        def close(self):
            pass

    return _JobBar
