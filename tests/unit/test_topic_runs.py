"""Run audits from hand-made descriptors, listings and WAL runs: every shape the real Danube
v0.7.3 broker leaves behind, and the legitimate shapes that must not be called stale."""

from __future__ import annotations

import numpy as np
import pytest

from connectors.snapshot import WalRun
from connectors.topic_runs import audit_runs, current_chain
from danube_core.records import ObjectDescriptor, SealedState

pytestmark = pytest.mark.unit

URL = "file:///cloud/storage/topics/default/t/objects/"


def desc(start: int, end: int, created: int) -> ObjectDescriptor:
    return ObjectDescriptor(object_id=f"data-{start}-{created}.dnb1", start_offset=start, end_offset=end,
                            size=100, etag=None, created_at=created, completed=True, offset_index=[(start, 0)])


def run(first: int, stop: int, pos0: int = 0, url: str = "file:///wal/default/t/wal.log") -> WalRun:
    return WalRun(url, first, np.arange(pos0, pos0 + 10 * (stop - first) + 1, 10, dtype=np.uint64))


def audit(descriptors, cur, listed=(), chain=(), others=(), sealed=None):
    return audit_runs("/default/t", sorted(descriptors, key=lambda d: d.start_offset), cur, URL,
                      list(listed), list(chain), list(others), sealed)


def spans(ranges) -> list[tuple[int, int]]:
    return [(r.start, r.stop) for r in ranges]


def test_clean_history_with_a_gap_is_one_run():
    ds = [desc(0, 9, 100), desc(20, 29, 102)]  # 10..19 lost: a gap, not another run
    result = audit(ds, 20, [(d.object_id, d.start_offset, None) for d in ds])
    assert result.clean and [d.start_offset for d in result.current_descriptors] == [0, 20]
    assert result.reused(0, 30) == []


def test_moved_race_shape():
    """Golden `moved`: B restarted at 0 (0..399, 400..599), A's 600..799 descriptor stays
    above, A's 0..599 object has no descriptor, A's seal at 799 predates B's uploads."""
    b0, b400, a600 = desc(0, 399, 1015), desc(400, 599, 1085), desc(600, 799, 1005)
    listed = [("data-0-995.dnb1", 0, 599), (b0.object_id, 0, None), (b400.object_id, 400, None),
              (a600.object_id, 600, None)]
    result = audit([b0, b400, a600], 400, listed, sealed=SealedState(7, 799, True, 1005))
    assert [d.object_id for d in result.current_descriptors] == [b0.object_id, b400.object_id]
    assert [d.object_id for d in result.stale_descriptors] == [a600.object_id]
    assert result.stale_seal is not None and (result.current_first, result.current_stop) == (0, 600)
    reused = result.reused(0, 600)
    assert spans(reused) == [(0, 600)]
    assert {s.name for s in reused[0].sources} == {"data-0-995.dnb1", "sealed state of broker 7"}


def test_upload_whose_cur_update_is_in_flight_is_current():
    ds = [desc(0, 9, 100), desc(10, 19, 101)]
    result = audit(ds, 0, [(d.object_id, d.start_offset, None) for d in ds])
    assert result.clean and result.current_stop == 20


def test_object_written_before_its_descriptor_is_not_an_orphan():
    ds = [desc(0, 9, 100)]
    result = audit(ds, 0, [(ds[0].object_id, 0, None), ("data-10-101.dnb1", 10, None)])
    assert result.clean


def test_restart_not_uploaded_yet_makes_the_uploads_stale():
    ds = [desc(0, 99, 100), desc(100, 199, 101)]
    old, new = run(0, 200), run(0, 30, pos0=2000)
    result = audit(ds, 100, [(d.object_id, d.start_offset, None) for d in ds], chain=[new], others=[old],
                   sealed=SealedState(3, 199, True, 50))
    assert result.current_descriptors == [] and (result.current_first, result.current_stop) == (0, 30)
    assert result.stale_seal is not None
    assert spans(result.reused(0, 30)) == [(0, 30)]
    assert {s.kind for s in result.reused(0, 30)[0].sources} == {"object", "wal", "sealed-state"}
    assert next(s for s in result.stale_sources if s.kind == "wal").name.endswith("wal.log#0")


def test_legitimate_seal_continued_by_the_next_owner_is_not_stale():
    ds = [desc(0, 99, 100), desc(100, 149, 200)]
    result = audit(ds, 100, [(d.object_id, d.start_offset, None) for d in ds], chain=[run(150, 160)],
                   sealed=SealedState(3, 99, True, 150))
    assert result.clean and result.stale_seal is None


def test_seal_with_an_unuploaded_tail_is_not_stale():
    """The real broker seals offsets it never uploaded (§6.4): a gap to report, not a stale seal."""
    ds = [desc(0, 99, 100)]
    result = audit(ds, 0, [(ds[0].object_id, 0, None)], sealed=SealedState(3, 120, True, 150))
    assert result.clean and result.stale_seal is None


def test_current_chain_prefers_cur_and_older_uploads():
    old, new = desc(0, 99, 100), desc(0, 29, 200)
    chain, stale = current_chain([new, desc(100, 199, 101)], 0)
    assert [d.start_offset for d in chain] == [0] and [d.start_offset for d in stale] == [100]
    chain, stale = current_chain([old], None)
    assert chain == [old] and stale == []


def test_uploads_after_the_audit_join_the_current_run_and_stale_ones_do_not():
    b0, a600 = desc(0, 599, 1015), desc(600, 799, 1005)
    result = audit([b0, a600], 0, [(b0.object_id, 0, None), (a600.object_id, 600, None)])
    assert result.stale_descriptors == [a600]
    result.advance([a600])  # still there, still older: not the current run's
    assert result.current_descriptors == [b0]
    b600 = desc(600, 649, 1100)  # B's own upload overwrote key 600
    assert result.continues(b600)
    result.advance([b600])
    assert result.current_descriptors == [b0, b600] and result.current_stop == 650
    assert spans(result.reused(0, 650)) == [(600, 650)]  # A's 600..649 are reused now
