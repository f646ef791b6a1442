"""Will a model fit this machine? Disk (a hard limit: refuse with the numbers) and memory (shown).

Memory need is an estimate: llama.cpp maps the weights (file size) and adds the KV cache and compute
buffers, which for the small models of the catalogue at an 8K context stay well under 0.5 GB.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..disk import DISK_MARGIN, free_bytes
from ..machine_memory import memory
from .errors import NotEnoughDisk

RAM_OVERHEAD = 512 * 1024 * 1024


@dataclass(frozen=True)
class FitReport:
    size_bytes: int
    disk_free: int
    disk_needed: int
    ram_total: int | None
    ram_available: int | None
    ram_needed: int
    where: str

    @property
    def disk_ok(self) -> bool:
        return self.disk_free >= self.disk_needed

    @property
    def ram_ok(self) -> bool | None:
        """None when the machine's memory could not be read."""
        ram = self.ram_available if self.ram_available is not None else self.ram_total
        return None if ram is None else ram >= self.ram_needed

    def summary(self) -> str:
        gb = lambda b: f"{b / 1e9:,.2f} GB"  # noqa: E731
        disk = f"disk: needs {gb(self.disk_needed)}, {gb(self.disk_free)} free ({'fits' if self.disk_ok else 'DOES NOT FIT'})"
        if self.ram_ok is None:
            ram = f"memory: needs about {gb(self.ram_needed)} (this machine's memory is unknown)"
        else:
            have = self.ram_available if self.ram_available is not None else self.ram_total
            ram = f"memory: needs about {gb(self.ram_needed)}, {gb(have)} available ({'fits' if self.ram_ok else 'tight: may swap'})"
        return f"{disk}; {ram}"

    def require_disk(self) -> None:
        if not self.disk_ok:
            raise NotEnoughDisk(self.disk_needed, self.disk_free, self.where)


def check_fit(size_bytes: int, target_dir: Path, disk_free: Callable[[Path], int] | None = None) -> FitReport:
    target_dir = Path(target_dir)
    free = (disk_free or free_bytes)(target_dir)
    total, available = memory()
    return FitReport(
        size_bytes=size_bytes,
        disk_free=int(free),
        disk_needed=int(size_bytes) + DISK_MARGIN,
        ram_total=total,
        ram_available=available,
        ram_needed=int(size_bytes) + RAM_OVERHEAD,
        where=str(target_dir),
    )
