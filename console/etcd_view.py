"""The console's one view of etcd: a `LocalCache` of the prefixes its pages read, connected in
the background so a page never waits on an etcd that is down.

Pages read the cache (memory only, kept current by one watch), so rendering costs no etcd
request whatever the number of topics. While etcd cannot be reached the view says so: before
the first listing there is nothing to show and `problem` names the endpoints and the error;
after it, the cache keeps serving what it last had (it re-lists by itself) and `problem` says
the figures may be stale.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from danube_core.errors import DanubeError
from danube_core.etcd_settings import EtcdSettings
from danube_core.keys import CLUSTER_PREFIX, NAMESPACES_PREFIX, SCHEMAS_PREFIX, TOPICS_PREFIX, StorageKeys
from danube_core.local_cache import LocalCache
from danube_core.metadata import MetadataStore
from speedlayer.keys import SpeedLayerKeys

logger = logging.getLogger(__name__)

RETRY_S = 2.0


def console_prefixes(root_prefix: str, speedlayer: SpeedLayerKeys) -> list[str]:
    """Every prefix a page reads: the broker's cluster, namespace, topic, schema and storage
    keys, and the speed layer's records (its zlib'd load plans, large and unread, left out)."""
    return [CLUSTER_PREFIX, NAMESPACES_PREFIX, TOPICS_PREFIX, SCHEMAS_PREFIX, StorageKeys(root_prefix).topics_prefix(),
            speedlayer.masters_prefix, speedlayer.workers_prefix, speedlayer.assignments_prefix,
            speedlayer.tenants_prefix, speedlayer.announce_prefix, speedlayer.drain_prefix,
            speedlayer.global_config]


class EtcdView:
    """`cache` once etcd has been listed (None before), `problem` while it cannot be reached."""

    def __init__(self, settings: EtcdSettings, prefixes: list[str],
                 connect: Callable[[], MetadataStore] | None = None) -> None:
        self.settings = settings
        self._prefixes = prefixes
        self._connect = connect or settings.connect
        self._store: MetadataStore | None = None
        self._cache: LocalCache | None = None
        self._error: str | None = "connecting"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="console-etcd", daemon=True)

    def start(self) -> "EtcdView":
        self._thread.start()
        return self

    def wait_ready(self, timeout_s: float) -> bool:
        """Whether the first listing arrived within `timeout_s` (tests and the benchmark)."""
        deadline = time.monotonic() + timeout_s
        while self._cache is None and time.monotonic() < deadline:
            time.sleep(0.02)
        return self._cache is not None

    @property
    def cache(self) -> LocalCache | None:
        return self._cache

    @property
    def store(self) -> MetadataStore | None:
        """The etcd store itself, for the few reads a cache does not hold (none on page paths)."""
        return self._store

    @property
    def problem(self) -> str | None:
        if self._cache is None:
            return f"etcd {self.settings.endpoints} unreachable: {self._error}"
        if not self._cache.synced:
            return (f"etcd {self.settings.endpoints} unreachable: showing what was read at revision "
                    f"{self._cache.revision}, possibly stale")
        return None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                store = self._connect()
                cache = LocalCache(store, self._prefixes, name="console", watch_prefix="/").start()
            except DanubeError as exc:
                self._error = str(exc)
                logger.warning("etcd %s: %s (retrying)", self.settings.endpoints, exc)
                self._stop.wait(RETRY_S)
                continue
            self._store, self._cache, self._error = store, cache, None
            return

    def close(self) -> None:
        self._stop.set()
        if self._cache is not None:
            self._cache.close()
        if self._store is not None:
            self._store.close()
