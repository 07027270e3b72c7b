"""What the Databricks notebooks share: widget values read as the `danube` source's options.

The notebooks take their storage settings from the same five widgets and accept publish times as
either milliseconds or ISO-8601 text; reading them here keeps the notebooks to what they show.
It sits beside them, not in the installed package (only notebooks use it): Databricks puts a
notebook's folder on `sys.path`, so `from notebook_widgets import ...` finds it there, and
`tests/notebook_runner.py` does the same.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Callable

WidgetGetter = Callable[[str], str]

# Widget name -> `danube` option; every notebook that reads storage declares these widgets.
STORAGE_WIDGETS = {
    "etcd_endpoints": "etcd.endpoints",
    "root_prefix": "rootPrefix",
    "storage_url": "storage.url",
    "storage_options": "storage.options",
    "wal_root": "walRoot",
}


def millis(text: str) -> int:
    """Milliseconds since the epoch from a number or ISO-8601 text (UTC unless it says otherwise)."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError as exc:
        raise ValueError(f"publish time {text!r}: expected milliseconds since the epoch or ISO-8601 text "
                         "such as 2024-05-01T12:00:00") from exc
    return int((parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)).timestamp() * 1000)


def source_options(widget: WidgetGetter) -> dict[str, str]:
    """The `danube` storage options from the notebook's widgets (an empty storage options widget is `{}`)."""
    options = {option: widget(name).strip() for name, option in STORAGE_WIDGETS.items()}
    options["storage.options"] = options["storage.options"] or "{}"
    return options
