"""Connector offsets: resolving starting/ending options, new topics, cursors, the JSON form."""

from __future__ import annotations

import json

import pytest

from connectors import offsets as off
from connectors.options import EARLIEST, LATEST, Position

TOPICS = ["/ns/a", "/ns/p-part-0", "/ns/p-part-1"]


class FakeLookups:
    """Earliest 10, latest 100 (per topic: + index), cursors and timestamps from tables."""

    def __init__(self, cursors: dict[str, int] | None = None) -> None:
        self.cursors = cursors or {}
        self.calls: list[tuple] = []

    def earliest_offsets(self, topics):
        self.calls.append(("earliest", tuple(topics)))
        return {t: 10 for t in topics}

    def latest_offsets(self, topics):
        self.calls.append(("latest", tuple(topics)))
        return {t: 100 + i for i, t in enumerate(topics)}

    def offsets_for_timestamp(self, topics, timestamp_ms):
        return {t: timestamp_ms // 1000 for t in topics}

    def read_cursor(self, topic, subscription):
        assert subscription == "sub"
        return self.cursors.get(topic)


@pytest.mark.parametrize(
    "position, expected",
    [
        (Position("earliest"), {"/ns/a": 10, "/ns/p-part-0": 10, "/ns/p-part-1": 10}),
        (Position("latest"), {"/ns/a": 100, "/ns/p-part-0": 101, "/ns/p-part-1": 102}),
        (Position("timestamp", timestamp_ms=42_000), {"/ns/a": 42, "/ns/p-part-0": 42, "/ns/p-part-1": 42}),
        # A base name covers every partition; -2/-1 mean earliest/latest as in Kafka.
        (Position("offsets", {"/ns/a": 5, "/ns/p": EARLIEST}), {"/ns/a": 5, "/ns/p-part-0": 10, "/ns/p-part-1": 10}),
        (Position("offsets", {"/ns/a": LATEST, "/ns/p": 3, "/ns/p-part-1": 4}), {"/ns/a": 100, "/ns/p-part-0": 3, "/ns/p-part-1": 4}),
    ],
)
def test_resolve_start(position: Position, expected: dict) -> None:
    assert off.resolve_start(position, TOPICS, FakeLookups(), "sub") == expected


def test_cursor_resumes_after_cursor_and_latest_without_one() -> None:
    lookups = FakeLookups(cursors={"/ns/a": 41, "/ns/p-part-1": 0})
    got = off.resolve_start(Position("cursor"), TOPICS, lookups, "sub")
    assert got == {"/ns/a": 42, "/ns/p-part-1": 1, "/ns/p-part-0": 100}


def test_cursor_needs_subscription() -> None:
    with pytest.raises(ValueError, match="'subscription'"):
        off.resolve_start(Position("cursor"), TOPICS, FakeLookups(), None)


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"/ns/a": 1}, r"missing \['/ns/p-part-0', '/ns/p-part-1'\]"),
        ({"/ns/a": 1, "/ns/p": 1, "/ns/zzz": 1}, r"not read \['/ns/zzz'\]"),
    ],
)
def test_offsets_json_must_cover_exactly_the_topics(spec: dict, message: str) -> None:
    with pytest.raises(ValueError, match="startingOffsets.*" + message):
        off.resolve_start(Position("offsets", spec), TOPICS, FakeLookups(), None)


def test_resolve_end() -> None:
    lookups = FakeLookups()
    assert off.resolve_end(None, ["/ns/a"], lookups) == {"/ns/a": 100}
    assert off.resolve_end(Position("latest"), ["/ns/a"], lookups) == {"/ns/a": 100}
    assert off.resolve_end(Position("offsets", {"/ns/a": 7, "/ns/p": LATEST}), TOPICS, lookups) == {
        "/ns/a": 7, "/ns/p-part-0": 100, "/ns/p-part-1": 101,
    }
    assert off.resolve_end(Position("timestamp", timestamp_ms=9000), ["/ns/a"], lookups) == {"/ns/a": 9}
    with pytest.raises(ValueError, match="endingOffsets"):
        off.resolve_end(Position("offsets", {"/ns/b": 1}), ["/ns/a"], lookups)


def test_no_topics_needs_no_lookups() -> None:
    lookups = FakeLookups()
    assert off.resolve_start(Position("latest"), [], lookups, None) == {}
    assert off.resolve_end(None, [], lookups) == {}
    assert lookups.calls == []


def test_new_topics_start_at_earliest_and_known_ones_keep_their_position() -> None:
    lookups = FakeLookups()
    got = off.with_new_topics({"/ns/a": 55}, ["/ns/a", "/ns/p-part-0"], lookups)
    assert got == {"/ns/a": 55, "/ns/p-part-0": 10}
    assert lookups.calls == [("earliest", ("/ns/p-part-0",))]
    assert off.with_new_topics({"/ns/a": 55}, ["/ns/a"], lookups) == {"/ns/a": 55}
    assert len(lookups.calls) == 1


def test_cap_counts_and_cursors() -> None:
    assert off.cap_at({"/a/x": 50, "/a/y": 5, "/a/new": 9}, {"/a/x": 40, "/a/y": 10}) == {"/a/x": 40, "/a/y": 5}
    assert off.message_counts({"/a/x": 10, "/a/y": 7}, {"/a/x": 15, "/a/y": 3}) == {"/a/x": 5, "/a/y": 0}
    assert off.cursor_values({"/a/x": 15, "/a/y": 0, "/a/z": 1}) == {"/a/x": 14, "/a/z": 0}


def test_source_offset_json_round_trip() -> None:
    offset = off.SourceOffset({"/ns/b": 2, "/ns/a": 1}, "sub", "h:1", {"/ns/a": {"messages": 3}})
    value = offset.to_json_dict()
    assert list(value["offsets"]) == ["/ns/a", "/ns/b"]
    text = json.dumps(value)
    assert off.SourceOffset.from_json(text) == offset
    assert off.SourceOffset.from_json_dict({"offsets": {}}) == off.SourceOffset({})


@pytest.mark.parametrize("text", ['{"/ns/a": 1}', '{"offsets": {"/ns/a": -1}}', '{"offsets": {"/ns/a": "1"}}', "nope"])
def test_source_offset_rejects_other_json(text: str) -> None:
    with pytest.raises(ValueError, match="offset"):
        off.SourceOffset.from_json(text)


def test_kafka_partition_0_of_an_unpartitioned_topic_is_the_topic() -> None:
    assert off.expand_spec("startingOffsets", {"/ns/t-part-0": 5}, ["/ns/t"]) == {"/ns/t": 5}
    assert off.expand_spec("startingOffsets", {"/ns/p-part-0": 5, "/ns/p-part-1": 6},
                           ["/ns/p-part-0", "/ns/p-part-1"]) == {"/ns/p-part-0": 5, "/ns/p-part-1": 6}
