"""Typed errors of the hub code. Each message says what happened and what the user can do."""
from __future__ import annotations

from backend.errors import Cancelled, RidgeFillError


class HubError(RidgeFillError):
    """A download, upload or catalogue operation that failed; the message is the reason."""


class UnknownModel(HubError):
    pass


class NotCachedOffline(HubError):
    """Offline mode, and the thing asked for is not in the cache."""


class NotEnoughDisk(HubError):
    def __init__(self, needed: int, free: int, where: str):
        self.needed, self.free, self.where = needed, free, where
        super().__init__(
            f"Not enough disk space: the download needs {needed / 1e6:,.1f} MB but {where} has "
            f"{free / 1e6:,.1f} MB free. Free some space or move the cache (RIDGEFILL_CACHE_DIR)."
        )


class VerificationFailed(HubError):
    pass


class MapsNotPublished(HubError):
    """No map set for this model/split on the hub: fit one locally instead."""


class DownloadCancelled(Cancelled):
    """The user cancelled a download; nothing partial was kept as ready."""
