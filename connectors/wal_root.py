"""The `walRoot` option's forms: `auto`, `none`, one shared root, a URL template with
`{broker_id}`, or a JSON map from broker id to WAL root URL.

Both the option parser (`connectors.options`, which checks a value before any query starts)
and the WAL finder (`connectors.wal_scan`, which follows it) need these forms; they live here so
neither imports the other. Nothing heavy is imported: executors unpickle the options.
"""

from __future__ import annotations

import json

from danube_core.errors import ConfigError

WAL_AUTO = "auto"  # each broker's registered `wal_url`
WAL_NONE = "none"  # sealed objects only, no WAL read
BROKER_ID_FIELD = "{broker_id}"
WAL_ROOT_FORMS = ("'auto', 'none', an fsspec URL or path of a shared WAL root, a URL template "
                  "with {broker_id}, or a JSON object {\"<broker id>\": \"<WAL root URL>\"}")


def parse_wal_map(value: str) -> dict[int, str] | None:
    """The JSON-map form of `walRoot` (`{"<broker id>": "<url>"}`), None for the other forms.

    ConfigError naming the option and the bad entry when the map is malformed.
    """
    if not value.lstrip().startswith("{"):
        return None
    try:
        raw = json.loads(value)
    except ValueError as exc:
        raise ConfigError(f"invalid value {value!r} for option 'walRoot': expected {WAL_ROOT_FORMS} "
                          f"({exc})") from exc
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"invalid value {value!r} for option 'walRoot': expected {WAL_ROOT_FORMS}")
    parsed: dict[int, str] = {}
    for broker, url in raw.items():
        if not (isinstance(broker, str) and broker.isdigit() and int(broker) < 2**64):
            raise ConfigError(f"option 'walRoot': key {broker!r} is not a broker id (a decimal u64, "
                              "as in /cluster/register/<id>)")
        if not isinstance(url, str) or not url.strip():
            raise ConfigError(f"option 'walRoot': broker {broker} maps to {url!r}; expected the URL "
                              "or path of that broker's WAL root (its wal_cloud.wal.dir)")
        parsed[int(broker)] = url.strip()
    return parsed
