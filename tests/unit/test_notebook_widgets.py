"""The notebooks' shared widget reading: publish times and the storage options."""

import pytest

from notebooks.notebook_widgets import millis, source_options


@pytest.mark.parametrize("text, expected", [
    ("1714564800000", 1714564800000),
    ("2024-05-01T12:00:00", 1714564800000),
    ("2024-05-01T14:00:00+02:00", 1714564800000),
    (" 2024-05-01T12:00:00 ", 1714564800000),
])
def test_millis_reads_numbers_and_iso_text_as_utc(text, expected):
    assert millis(text) == expected


def test_millis_names_the_bad_value_and_the_accepted_forms():
    with pytest.raises(ValueError, match=r"'yesterday'.*milliseconds since the epoch or ISO-8601"):
        millis("yesterday")


def test_source_options_maps_widgets_and_defaults_empty_storage_options():
    widgets = {"etcd_endpoints": "127.0.0.1:2379 ", "root_prefix": "/danube-data", "storage_url": "s3://b/p",
               "storage_options": "", "wal_root": "auto"}
    assert source_options(widgets.__getitem__) == {
        "etcd.endpoints": "127.0.0.1:2379", "rootPrefix": "/danube-data", "storage.url": "s3://b/p",
        "storage.options": "{}", "walRoot": "auto"}
