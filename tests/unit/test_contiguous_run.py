"""A clean run folded page by page (`ContiguousRun`) gives the audit the whole list gives, and
any shape that is not one clean run stops the fold, so the catalog audits it whole."""

from __future__ import annotations

import random

import pytest

from connectors.topic_runs import COMPACT_KEEP, ContiguousRun, audit_contiguous_run
from danube_core.object_id_ranges import start_offset_prefixes
from danube_core.records import SealedState
from tests.unit.test_topic_runs import URL, audit, desc, run

pytestmark = pytest.mark.unit


def fold(descriptors, listed_ids, page=7) -> ContiguousRun:
    folded = ContiguousRun(listed_ids)
    for i in range(0, len(descriptors), page):
        if not folded.take(descriptors[i:i + page]):
            break
    return folded


def clean_history(rng: random.Random, count: int) -> list:
    out, start, created = [], rng.randrange(0, 50), 1000
    for _ in range(count):
        size = rng.randrange(1, 30)
        created += rng.randrange(0, 3)  # several uploads in one second share a time
        out.append(desc(start, start + size - 1, created))
        start += size
    return out


def summary(result):
    return (result.clean, result.current_first, result.current_stop, sorted(result.held),
            [d.object_id for d in result.current_descriptors], result.stale_descriptors,
            sorted((s.kind, s.name, s.first_offset, s.last_offset) for s in result.stale_sources),
            result.stale_seal, [(r.start, r.stop) for r in result.reused(0, result.current_stop or 0)])


@pytest.mark.parametrize("seed", range(40))
def test_a_clean_fold_audits_as_the_whole_list_does(seed):
    rng = random.Random(seed)
    ds = clean_history(rng, rng.randrange(1, 200))
    listed = [(d.object_id, d.start_offset, None) for d in ds]
    # Sometimes older runs' objects no descriptor references; an upload whose descriptor is not
    # written, or an older one above the head.
    for d in rng.sample(ds, min(rng.choice((0, 0, 3)), len(ds))):
        listed.append((f"data-{d.start_offset}-{d.created_at - 500}.dnb1", d.start_offset, d.end_offset))
    head = ds[-1].end_offset + 1
    listed.append((f"data-{head}-{ds[-1].created_at + rng.choice((-1, 0, 1))}.dnb1", head, head + 4))
    wal = [run(head - rng.randrange(0, 5), head + rng.randrange(0, 20))]
    sealed = SealedState(7, head - 1 + rng.randrange(-5, 5), True, ds[-1].created_at + rng.randrange(-2, 2))
    cur = rng.choice(ds[-3:]).start_offset

    whole = audit(ds, cur, listed, wal, sealed=sealed)
    whole.compact()
    folded = fold(ds, [oid for oid, _, _ in listed], page=rng.randrange(1, 50))
    assert folded.clean
    lasts = {oid: last for oid, _, last in listed}
    unreferenced = [(oid, start, lasts[oid]) for oid, start in folded.unreferenced()]
    contiguous = audit_contiguous_run("/default/t", folded, URL, unreferenced, wal, [], sealed)
    contiguous.compact()  # as the catalog does with either
    assert len(folded.newest) == min(len(ds), COMPACT_KEEP)
    if whole.clean:
        assert summary(contiguous) == summary(whole)
    else:  # the catalog audits it whole: an unclean run's reads are planned from every descriptor
        assert not contiguous.clean
        assert sorted(s.name for s in contiguous.stale_sources) == sorted(s.name for s in whole.stale_sources)


@pytest.mark.parametrize("shape", ["gap", "overlap", "older upload above", "restart at 0"])
def test_any_other_shape_stops_the_fold(shape):
    ds = clean_history(random.Random(1), 30)
    late = ds[20]
    if shape == "gap":
        ds[20] = desc(late.start_offset + 1, late.end_offset, late.created_at)
    elif shape == "overlap":
        ds.insert(21, desc(late.start_offset + 1, late.end_offset + 3, late.created_at))
    elif shape == "older upload above":
        ds[20] = desc(late.start_offset, late.end_offset, ds[19].created_at - 1)
    else:
        ds[0] = desc(0, ds[-1].end_offset + 50, ds[-1].created_at + 10)
    assert not fold(ds, []).clean


@pytest.mark.parametrize("seed", range(200))
def test_start_offset_prefixes_cover_the_range_and_little_else(seed):
    rng = random.Random(seed)
    first = int(10 ** rng.uniform(0, 9))
    last = first + int(10 ** rng.uniform(0, 7))
    prefixes = start_offset_prefixes(first, last)
    if prefixes is None:
        return  # listed whole
    assert 0 < len(prefixes) <= 64 and "" not in prefixes
    probe = [first, last, *(rng.randint(first, last) for _ in range(200))]
    assert all(any(str(n).startswith(p) for p in prefixes) for n in probe)
    # Names a listing returns that reach into the range: the range and at most a page at each
    # end per number length (the numbers of length L starting with p are one interval).
    lengths = range(len(str(first)), len(str(last)) + 1)
    returned = 0
    for p in prefixes:
        for length in lengths:
            if length >= len(p):
                low, high = int(p) * 10 ** (length - len(p)), (int(p) + 1) * 10 ** (length - len(p)) - 1
                returned += high - low + 1 if low <= last and high >= first else 0
    if len(lengths) == 1:
        assert returned <= (last - first + 1) + 2 * 1000
    else:  # a range across a power of ten: a shorter length's prefix also lists longer numbers
        assert returned <= 10 * (last - first + 1) + 2 * 1000 * len(lengths)


def test_start_offset_prefixes_near_the_head_of_a_long_history():
    assert start_offset_prefixes(999_990, 1_000_005) == ["99999", "100000"]
    assert start_offset_prefixes(123_456_000, 123_460_000) == ["123456", "123457", "123458", "123459", "123460000"]
    assert start_offset_prefixes(0, 10 ** 6) is None


def test_start_offset_prefixes_refuse_a_backward_range():
    with pytest.raises(ValueError, match=r"start offsets \[5, 4\]: expected 0 <= first <= last"):
        start_offset_prefixes(5, 4)
