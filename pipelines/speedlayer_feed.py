"""A pipeline that feeds a speed-layer dataset announces each commit of its target table.

Configured by the pipeline file's optional `speedlayer:` section (its own small dataclass so
the rest of the file's schema does not change):

    speedlayer:
      tenant: acme                # the speed-layer tenant and dataset the target table feeds
      dataset: orders
      # etcd_endpoints: 10.0.0.5:2379   # the speed layer's etcd (default: source.etcd_endpoints)
      # options:                        # its etcd.* options, as in source.options (default: the
      #   etcd.user: announcer          # source's etcd.* options, TLS files and password included)
      #   etcd.password: ${SL_ETCD_PASSWORD}
      #   etcd.caCert: /etc/ssl/sl-ca.pem
      # key_root: ""                    # the speed layer's etcd.key_root
      # storage_options: {}             # delta-rs options to read the target's version (S3 keys)

Without `etcd_endpoints` and `options` the announcements go through the pipeline's own etcd
connection. With either, the announcer opens its own (`danube_core.etcd_settings`): the
speed layer's endpoints with `options` if given, else with the source's `etcd.*` options
(user, password, caCert, certKey, certCert, timeoutMs), as the cursor commits do.

After a batch's Delta commits *and* its cursor commit, the sink announces the target's new
version through the speed layer's public `speedlayer.announce.announce` (the key and record are
the speed layer's business, not the pipeline's); the leading master watches those announcements
and plans the next epoch at once instead of at its next poll. Announcing is best effort: the
master also polls, so a failed announcement is logged and counted
(`PipelineMetrics.totals()["announce_failures"]`) and never fails the batch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Mapping

from danube_core.errors import ConfigError, DanubeError
from danube_core.etcd_settings import EtcdSettings
from danube_core.metadata import MetadataStore

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SpeedLayerFeed:
    """The `speedlayer:` section of a pipeline file."""

    tenant: str
    dataset: str
    etcd_endpoints: str | None = None
    key_root: str = ""
    storage_options: Mapping[str, str] = field(default_factory=dict)
    # The speed layer etcd's `etcd.*` options (a password among them: kept out of repr); None: the source's.
    options: Mapping[str, str] | None = field(default=None, repr=False)


def check_feed(feed: SpeedLayerFeed, source_options: Mapping[str, str]) -> list[tuple[str, str]]:
    """(key, problem) pairs for the config loader to report with the file's name;
    `source_options` are the source's `danube` options (its etcd ones are the default)."""
    from speedlayer.announce import announce_problems

    problems = [(f"speedlayer.{name}", problem)
                for name, problem in announce_problems(feed.tenant, feed.dataset, feed.key_root).items()]
    if feed.options is not None:
        try:
            feed_etcd_settings(feed, source_options)
        except ConfigError as exc:
            problems.append(("speedlayer.options", str(exc)))
    return problems


def feed_etcd_settings(feed: SpeedLayerFeed, reader_options: Mapping[str, str]) -> EtcdSettings | None:
    """How the announcer reaches the speed layer's etcd; None: through the pipeline's own
    connection (no `etcd_endpoints`, no `options`). `reader_options` are the pipeline reader's
    `danube` options. ConfigError naming the option for a bad one."""
    from connectors import options as opt

    if feed.etcd_endpoints is None and feed.options is None:
        return None
    etcd_keys = {key.lower() for key in opt.ETCD_OPTIONS}
    if feed.options is None:
        chosen = {k: v for k, v in reader_options.items() if k.lower() in etcd_keys}
    else:
        unknown = sorted(k for k in feed.options if k.lower() not in etcd_keys or k.lower() == opt.ETCD_ENDPOINTS.lower())
        if unknown:
            raise ConfigError(f"option {unknown[0]!r} is not an etcd option of the speed layer's etcd; accepted: "
                              + ", ".join(k for k in opt.ETCD_OPTIONS if k != opt.ETCD_ENDPOINTS)
                              + " (the endpoints are speedlayer.etcd_endpoints)")
        chosen = dict(feed.options)
    endpoints = feed.etcd_endpoints or next(
        (v for k, v in reader_options.items() if k.lower() == opt.ETCD_ENDPOINTS.lower()), "")
    return opt.parse_etcd({**chosen, opt.ETCD_ENDPOINTS: endpoints})


class CommitAnnouncer:
    """Announces the target table's commits for one pipeline; `metadata` is the pipeline's etcd,
    `etcd` the speed layer's when it needs a connection of its own (`feed_etcd_settings`)."""

    def __init__(self, feed: SpeedLayerFeed, table_uri: str, writer: str, metadata: MetadataStore,
                 etcd: EtcdSettings | None = None) -> None:
        from speedlayer.announce import announcement_key

        self.feed, self.table_uri, self.writer = feed, table_uri, writer
        self._key = announcement_key(feed.tenant, feed.dataset, feed.key_root)
        self._shared = metadata
        if etcd is None and feed.etcd_endpoints is not None:
            etcd = EtcdSettings(feed.etcd_endpoints)
        self._etcd = etcd
        self._own: MetadataStore | None = None
        self.announced = 0
        self.failures = 0

    def announce(self) -> bool:
        """Put the announcement for the table's current version; False (logged) if it failed."""
        from speedlayer.announce import announce

        try:
            version = self._version()
            announce(self._metadata(), self.feed.tenant, self.feed.dataset, self.table_uri, version=version,
                     writer=self.writer, key_root=self.feed.key_root)
        except (DanubeError, OSError) as exc:
            self.failures += 1
            logger.warning("announcing the commit of %s to the speed layer (%s) failed, the master's poll will "
                           "find it: %s", self.table_uri, self._key, exc)
            return False
        self.announced += 1
        logger.debug("announced %s version %d at %s", self.table_uri, version, self._key)
        return True

    def _version(self) -> int:
        """The table's newest version from its log (-1 when it cannot be read: the master reads
        the log itself; the version is informative)."""
        if "://" not in self.table_uri and not self.table_uri.startswith("/"):
            return -1  # a metastore table name: no log to read here
        try:
            from deltalake import DeltaTable

            return DeltaTable(self.table_uri, storage_options=dict(self.feed.storage_options) or None,
                              without_files=True).version()
        except Exception as exc:  # noqa: BLE001 - any reader failure only loses the hint's version
            logger.debug("no Delta version for %s: %s", self.table_uri, exc)
            return -1

    def _metadata(self) -> MetadataStore:
        if self._etcd is None:
            return self._shared
        if self._own is None:
            self._own = self._etcd.connect()
        return self._own

    def close(self) -> None:
        if self._own is not None:
            self._own.close()
            self._own = None
