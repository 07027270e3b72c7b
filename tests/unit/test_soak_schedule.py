"""The soak's schedule (`devstack/chaos/schedule.py`): a seed names a run's faults exactly, faults
overlap only on different resources, every kind comes before any comes twice, and a fault
kind the soak cannot make real is refused by name."""

from __future__ import annotations

import pytest

from devstack.chaos.schedule import KINDS, NOT_DONE, make_schedule, parse_kinds

ALL = tuple(KINDS)


def test_the_same_seed_gives_the_same_schedule():
    assert make_schedule(43, 600, ALL) == make_schedule(43, 600, ALL)


def test_another_seed_gives_another_schedule():
    assert make_schedule(43, 600, ALL) != make_schedule(44, 600, ALL)


def test_every_fault_ends_inside_the_window_with_quiet_periods_between_storms():
    events = make_schedule(7, 900, ALL)
    assert all(0 <= e.start_s and e.start_s + e.duration_s <= 900.05 for e in events), events
    starts = sorted(e.start_s for e in events)
    assert max(b - a for a, b in zip(starts, starts[1:])) >= 8, "no quiet period between storms"


def test_faults_overlap_but_never_on_one_resource():
    events = make_schedule(11, 1800, ALL)
    overlapping = 0
    for i, a in enumerate(events):
        for b in events[i + 1:]:
            if b.start_s < a.start_s + a.duration_s:
                overlapping += 1
                assert KINDS[a.kind].resource(a.target) != KINDS[b.kind].resource(b.target), (a, b)
    assert overlapping > 0


def test_a_short_run_meets_every_kind_once_before_any_twice():
    events = make_schedule(3, 180, ALL)
    first = [e.kind for e in events][: len(ALL)]
    assert len(set(first)) >= len(ALL) - 3  # a kind drawn while its resource is busy is skipped
    assert {e.kind for e in make_schedule(3, 600, ALL)} == set(ALL)


def test_only_the_named_kinds_are_scheduled():
    events = make_schedule(5, 300, ("broker_kill", "s3_503"))
    assert {e.kind for e in events} == {"broker_kill", "s3_503"}


def test_fault_names_are_checked():
    assert parse_kinds("all") == ALL
    assert parse_kinds("broker_kill, s3_503,broker_kill") == ("broker_kill", "s3_503")
    with pytest.raises(ValueError, match=r"unknown kind\(s\) \['brokr_kill'\]"):
        parse_kinds("brokr_kill")
    for name, why in NOT_DONE.items():
        with pytest.raises(ValueError, match="not available") as refused:
            parse_kinds(f"broker_kill,{name}")
        assert why in str(refused.value)
