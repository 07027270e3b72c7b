"""This host's CPU, memory, disk and network usage from /proc, for the LoadReport (spec §5.5).

The v0.7.3 broker reports four resources, always in this order: `CPU` and `Memory` as
percentages, `DiskIO` and `NetworkIO` as bytes per second (read + written, received + sent),
each an f64. Its native monitor (sysinfo) measures the whole host: CPU over a short sample,
memory as used / total, network as the change of every interface's byte counters (including
`lo`) since the previous report, and disk I/O not at all (always 0). Here every value is
measured over the interval between two reports, from the kernel's counters:

* CPU: busy share of all CPUs' time in `/proc/stat` (busy = everything but idle and iowait);
* Memory: `(MemTotal - MemAvailable) / MemTotal` from `/proc/meminfo` (sysinfo's "used");
* DiskIO: sectors read + written (512 bytes each, whatever the device's sector size) in
  `/proc/diskstats`, over whole physical disks only (those with a `/sys/block/<name>/device`
  link), so partitions, device-mapper, loop and zram devices do not count the same bytes twice;
* NetworkIO: received + transmitted bytes of every interface in `/proc/net/dev`.

Rates are truncated to whole bytes per second (the broker computes a u64 and then casts it to
f64), so they print as `1234.0`. A counter that went backwards (an interface removed) counts
as 0, as the broker's saturating subtraction does. The first sample has no previous one: its
CPU and I/O rates are 0.0, as the broker's first network rate is. A file that cannot be read
(another OS, a restricted /proc) gives 0.0 for its resource, never an error.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Callable

logger = logging.getLogger(__name__)

RESOURCE_NAMES = ("CPU", "Memory", "DiskIO", "NetworkIO")
"""`ResourceType` variants in the order the broker lists them in `resources_usage`."""

SECTOR_BYTES = 512  # /proc/diskstats counts 512-byte sectors on every device


@dataclass(frozen=True)
class _Counters:
    """Cumulative kernel counters at one moment; None where the source was unreadable."""

    at: float
    cpu_busy_total: tuple[int, int] | None
    disk_bytes: int | None
    network_bytes: int | None


def _rate(before: int | None, after: int | None, elapsed_s: float) -> float:
    if before is None or after is None or elapsed_s <= 0:
        return 0.0
    return float(int(max(after - before, 0) / elapsed_s))


class ResourceSampler:
    """Successive samples of this host's resource usage; `sample()` once per load report.

    `proc_dir`/`sys_block_dir` and `clock` (monotonic seconds) exist for tests.
    """

    def __init__(
        self,
        *,
        proc_dir: str = "/proc",
        sys_block_dir: str = "/sys/block",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._proc = proc_dir
        self._sys_block = sys_block_dir
        self._clock = clock
        self._previous: _Counters | None = None

    def sample(self) -> list[dict]:
        """`[{"resource": name, "usage": f64}, ...]` for CPU, Memory, DiskIO, NetworkIO."""
        now = _Counters(self._clock(), self._cpu_times(), self._disk_bytes(), self._network_bytes())
        before, self._previous = self._previous, now
        usages = [0.0, self._memory_percent(), 0.0, 0.0]
        if before is not None:
            elapsed = now.at - before.at
            usages[0] = _cpu_percent(before.cpu_busy_total, now.cpu_busy_total)
            usages[2] = _rate(before.disk_bytes, now.disk_bytes, elapsed)
            usages[3] = _rate(before.network_bytes, now.network_bytes, elapsed)
        return [{"resource": name, "usage": usage} for name, usage in zip(RESOURCE_NAMES, usages)]

    def _read(self, name: str) -> list[str] | None:
        try:
            with open(os.path.join(self._proc, name), encoding="ascii", errors="replace") as handle:
                return handle.read().splitlines()
        except OSError as exc:
            logger.debug("cannot read %s: %s", os.path.join(self._proc, name), exc)
            return None

    def _cpu_times(self) -> tuple[int, int] | None:
        """(busy, total) jiffies of all CPUs; guest time is already inside user and nice."""
        lines = self._read("stat")
        try:
            fields = [int(v) for v in lines[0].split()[1:9]] if lines and lines[0].startswith("cpu ") else None
        except ValueError:
            return None
        if not fields:
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return sum(fields) - idle, sum(fields)

    def _memory_percent(self) -> float:
        lines = self._read("meminfo") or []
        try:
            fields = {line.split(":")[0]: int(line.split()[1]) for line in lines if ":" in line}
            total, available = fields["MemTotal"], fields["MemAvailable"]
            return (total - available) / total * 100.0
        except (IndexError, KeyError, ValueError, ZeroDivisionError):
            return 0.0

    def _disk_bytes(self) -> int | None:
        lines = self._read("diskstats")
        if lines is None:
            return None
        total = 0
        for line in lines:
            parts = line.split()
            # major minor name reads merged sectors_read ms writes merged sectors_written ...
            if len(parts) >= 10 and self._is_physical_disk(parts[2]):
                try:
                    total += (int(parts[5]) + int(parts[9])) * SECTOR_BYTES
                except ValueError:
                    continue
        return total

    def _is_physical_disk(self, name: str) -> bool:
        return os.path.exists(os.path.join(self._sys_block, name.replace("/", "!"), "device"))

    def _network_bytes(self) -> int | None:
        lines = self._read("net/dev")
        if lines is None:
            return None
        total = 0
        for line in lines[2:]:  # two header lines
            _, sep, counters = line.partition(":")
            parts = counters.split()
            if sep and len(parts) >= 9:
                try:
                    total += int(parts[0]) + int(parts[8])  # receive bytes, transmit bytes
                except ValueError:
                    continue
        return total


def _cpu_percent(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float:
    if before is None or after is None or after[1] <= before[1]:
        return 0.0
    busy = max(after[0] - before[0], 0)
    return min(busy / (after[1] - before[1]) * 100.0, 100.0)
