"""A broker's WAL on a filesystem of its own, which the disk_full fault fills.

Each broker's WAL directory is a tmpfs mount (`mount -t tmpfs`, which needs root with
CAP_SYS_ADMIN, as this machine and CI have); the fault allocates every free block to a filler
file for its length and then deletes it, so the broker meets ENOSPC on its WAL writes exactly
as on a full disk. Where the mount is refused, the soak cannot offer the fault and says so
when it is asked for.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SIZE = "256m"
FILLER = ".soak-disk-full"


def mount(directory: Path) -> None:
    """A fresh tmpfs at `directory`; RuntimeError with mount's own words if refused."""
    directory.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(directory)],
                          capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"cannot mount a tmpfs for the WAL at {directory} (the disk_full fault needs one; "
                           f"leave disk_full out of --faults to run without it): {done.stderr.strip()}")


def unmount(directory: Path) -> None:
    subprocess.run(["umount", "-l", str(directory)], capture_output=True, timeout=30)


def fill(directory: Path) -> int:
    """Allocate every free byte of the filesystem at `directory`; the bytes taken."""
    stats = os.statvfs(directory)
    free = stats.f_bavail * stats.f_frsize
    fd = os.open(directory / FILLER, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        taken = 0
        chunk = 1 << 20
        while True:  # allocate in chunks until ENOSPC: the last bytes go too
            try:
                os.posix_fallocate(fd, taken, chunk)
                taken += chunk
            except OSError:
                if chunk == 4096:
                    break
                chunk //= 2
        return taken if taken else free
    finally:
        os.close(fd)


def free(directory: Path) -> None:
    try:
        os.unlink(directory / FILLER)
    except FileNotFoundError:
        pass
