"""A broker's identity across restarts on the same data: the id and registration lease it had.

The real Danube broker picks a new random id at every start, so after a crash its topics wait
until the old registration lease expires (32 s) and the leader moves them. Our broker keeps,
in its WAL root, the id and registration lease of the process that last registered from it,
and a lock file that only the live process holds. A restart that gets the lock (so the old
process is gone and no other process uses this data) and finds that lease still alive (so the
leader has not failed its topics over: failover starts only once the registration is gone,
and no other broker can have been given them) takes the same id and lease back, and loads its
assignments at once from its own WAL. If the lease has expired it starts as a new broker.
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass

from danube_core.errors import ConfigError, DanubeError
from danube_core.keys import register_key
from danube_core.metadata import Lease, MetadataStore

IDENTITY_FILE = "broker.identity"
LOCK_FILE = "broker.lock"


@dataclass(frozen=True)
class BrokerIdentity:
    """The id a broker registered with and the lease its registration is bound to."""

    broker_id: int
    lease_id: int


class DataDirLock:
    """An exclusive lock on a broker's WAL root, held for the life of the process."""

    def __init__(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, LOCK_FILE)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            raise ConfigError(f"WAL directory {directory} is in use by another running broker "
                              f"(it holds {self.path}); give each broker its own wal_cloud.wal.dir") from None

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing the descriptor drops the lock
            self._fd = -1


def read_identity(directory: str) -> BrokerIdentity | None:
    """The identity the last broker on this WAL root registered with; None if none or unreadable."""
    try:
        with open(os.path.join(directory, IDENTITY_FILE), encoding="utf-8") as fh:
            value = json.load(fh)
        return BrokerIdentity(int(value["broker_id"]), int(value["lease_id"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return None  # a torn or foreign file: start as a new broker, which is always safe


def resume_identity(metadata: MetadataStore, identity: BrokerIdentity | None, ttl_s: int) -> Lease | None:
    """The previous process's registration lease, refreshed, if it is still alive and still
    holds that broker's registration; None otherwise (then the broker starts with a new id)."""
    if identity is None or metadata.get(register_key(identity.broker_id)) is None:
        return None
    try:
        return metadata.resume_lease(identity.lease_id, ttl_s)
    except DanubeError:
        return None


def write_identity(directory: str, identity: BrokerIdentity) -> None:
    """Record the identity atomically (temp file, fsync, rename)."""
    path = os.path.join(directory, IDENTITY_FILE)
    temp = path + ".tmp"
    with open(temp, "w", encoding="utf-8") as fh:
        json.dump({"broker_id": identity.broker_id, "lease_id": identity.lease_id}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(temp, path)
