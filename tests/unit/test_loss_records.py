"""Executor-side skips travel to the driver as record files (connectors.loss_records)."""

from __future__ import annotations

from connectors.data_loss import LostRange
from connectors.loss_records import collect, record_url, write_record

START, END = {"/default/t": 10}, {"/default/t": 30}


def lost(start: int, end: int, topic: str = "/default/t") -> LostRange:
    return LostRange(topic, start, end, "object deleted", "file:///x.dnb1")


def test_records_are_counted_once_then_deleted(tmp_path) -> None:
    location = str(tmp_path / "lost")
    write_record(record_url(location, START, END, 0), {}, [lost(10, 17)])
    write_record(record_url(location, START, END, 1), {}, [lost(20, 22), lost(5, 6, "/default/u")])
    assert collect(location, {}) == {"/default/t": 9, "/default/u": 1}
    assert collect(location, {}) == {}
    assert list((tmp_path / "lost").iterdir()) == []


def test_a_retried_task_overwrites_its_record_instead_of_adding_one(tmp_path) -> None:
    location = str(tmp_path / "lost")
    url = record_url(location, START, END, 3)
    assert url == record_url(location, dict(START), dict(END), 3)  # fixed by batch and partition
    assert url != record_url(location, START, {"/default/t": 31}, 3)
    write_record(url, {}, [lost(10, 17)])
    write_record(url, {}, [lost(10, 17)])
    assert collect(location, {}) == {"/default/t": 7}


def test_no_record_for_nothing_skipped_and_no_directory_is_no_loss(tmp_path) -> None:
    location = str(tmp_path / "lost")
    write_record(record_url(location, START, END, 0), {}, [lost(4, 4)])
    assert not (tmp_path / "lost").exists()
    assert collect(location, {}) == {}


def test_an_unreadable_record_is_left_for_the_next_trigger(tmp_path) -> None:
    location = tmp_path / "lost"
    location.mkdir()
    (location / "abc-00000.lost.json").write_text('{"ranges": [')
    assert collect(str(location), {}) == {}
    assert (location / "abc-00000.lost.json").exists()
