"""Reading the components' Prometheus endpoints: one scrape, parsed with prometheus-client's own
text parser, with a short timeout, and a failure said in words instead of raised.

The console needs nothing new from a component: a page shows the figures an endpoint already
exports and "—" for those it does not (an older component, a metric not added yet), and an
endpoint that does not answer is named on the page while the rest renders.
"""

from __future__ import annotations

import logging
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from prometheus_client.parser import text_string_to_metric_families

logger = logging.getLogger(__name__)

MAX_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True)
class Scrape:
    """One endpoint's samples, or why there are none (`problem`)."""

    endpoint: str
    samples: list[Sample] = field(default_factory=list)
    problem: str | None = None

    def values(self, name: str, **labels: str) -> list[Sample]:
        return [s for s in self.samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]

    def total(self, name: str, **labels: str) -> float | None:
        """The sum of `name`'s samples matching `labels`; None when the endpoint exports none."""
        found = self.values(name, **labels)
        return sum(s.value for s in found) if found else None

    def families(self, prefixes: Iterable[str]) -> list[Sample]:
        """Samples whose name starts with one of `prefixes` (what a page lists as is)."""
        wanted = tuple(prefixes)
        return [s for s in self.samples if s.name.startswith(wanted)]


def metrics_url(endpoint: str) -> str:
    """`host:port` -> `http://host:port/metrics`; a URL is kept (with /metrics added to a bare one)."""
    url = endpoint if "://" in endpoint else f"http://{endpoint}"
    return url if url.rstrip("/").endswith("/metrics") else url.rstrip("/") + "/metrics"


def scrape(endpoint: str, timeout_s: float) -> Scrape:
    url = metrics_url(endpoint)
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 (http(s) only, from config/etcd)
            text = response.read(MAX_BYTES).decode("utf-8", "replace")
    except (OSError, urllib.error.URLError, ValueError) as exc:
        return Scrape(endpoint, problem=f"metrics endpoint {url} unreachable: {exc}")
    try:
        samples = [Sample(s.name, dict(s.labels), float(s.value))
                   for family in text_string_to_metric_families(text) for s in family.samples]
    except ValueError as exc:
        return Scrape(endpoint, problem=f"metrics endpoint {url} answered text Prometheus cannot parse: {exc}")
    return Scrape(endpoint, samples)


def histogram_quantile(scrape: Scrape, name: str, quantile: float, **labels: str) -> float | None:
    """The `quantile` of histogram `name` (its `_bucket` samples summed over other labels), by
    linear interpolation inside the bucket as PromQL's histogram_quantile does; None without data."""
    buckets: dict[float, float] = {}
    for sample in scrape.values(f"{name}_bucket", **labels):
        bound = float(sample.labels.get("le", "+Inf"))
        buckets[bound] = buckets.get(bound, 0.0) + sample.value
    if not buckets:
        return None
    ordered = sorted(buckets.items())
    total = ordered[-1][1]
    if total <= 0:
        return None
    rank, previous_bound, previous_count = quantile * total, 0.0, 0.0
    for bound, count in ordered:
        if count >= rank:
            if bound == float("inf"):
                return previous_bound
            width = count - previous_count
            return previous_bound + (bound - previous_bound) * ((rank - previous_count) / width if width else 1.0)
        previous_bound, previous_count = bound, count
    return previous_bound
