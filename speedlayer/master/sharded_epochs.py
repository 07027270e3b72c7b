"""A sharded epoch's state from its shards' records: pure record arithmetic, applied by the leader.

Each shard is placed, replicated, retried and failed like an epoch of its own (placement,
load_failures); the epoch record only follows them, so that the lifecycle and the gateway can
treat the epoch as one thing:

* `rolled_up`: the epoch is ASSIGNED once every shard is, counts the shards with a READY
  replica (`ready_shards`; queryable when that is all of them, first stamped in `ready_ms`),
  and turns FAILED as soon as one shard FAILED (its loads failed everywhere), naming each
  shard's reasons: an epoch is served whole or not at all;
* `shard_note`: what `status` says of a sharded epoch: its shards, how many are READY, and
  what each shard that is not placed lacks (capacity needed against capacity free);
* `cascaded`: the shards of an epoch that FAILED or was EVICTED end the same way, without
  replicas, so that the workers drop them and nothing of the epoch stays placed.
"""

from __future__ import annotations

from dataclasses import replace

from speedlayer.records import ASSIGNED, EVICTED, FAILED, PLANNED, R_READY, AssignmentRecord


def shard_id(epoch: str, index: int) -> str:
    """The epoch id of shard `index` of `epoch` (a valid id: epoch ids leave room for it)."""
    return f"{epoch}.s{index}"


def shard_ready(shard: AssignmentRecord) -> bool:
    return shard.status == ASSIGNED and any(r.state == R_READY for r in shard.replicas.values())


def rolled_up(epoch: AssignmentRecord, shards: dict[str, AssignmentRecord], now_ms: int) -> AssignmentRecord | None:
    """`epoch` as its `shards` (shard id -> record; missing: not created yet) say; None: unchanged."""
    if not epoch.sharded or epoch.status not in (PLANNED, ASSIGNED):
        return None
    failed = [shards[s] for s in epoch.shards if s in shards and shards[s].status == FAILED]
    if failed:
        reasons = "; ".join(f"shard {s.epoch}: {s.message or 'failed'}" for s in failed)
        return replace(epoch, status=FAILED, ready_shards=0,
                       message=f"{len(failed)} of {len(epoch.shards)} shards failed to load, so the epoch is "
                               f"not served (the previous one stays): {reasons}")
    present = [shards[s] for s in epoch.shards if s in shards]
    ready = sum(shard_ready(s) for s in present)
    placed = len(present) == len(epoch.shards) and all(s.status == ASSIGNED for s in present)
    updated = replace(epoch, status=ASSIGNED if placed else epoch.status, ready_shards=ready,
                      ready_ms=epoch.ready_ms or (now_ms if ready == len(epoch.shards) else 0))
    return None if updated == epoch else updated


def cascaded(shard: AssignmentRecord, epoch: AssignmentRecord | None) -> AssignmentRecord | None:
    """`shard` ended like its FAILED or EVICTED epoch (None: it stands)."""
    if epoch is None or epoch.status not in (FAILED, EVICTED) or not shard.live:
        return None
    why = "evicted with" if epoch.status == EVICTED else "not loaded: another shard of"
    return replace(shard, status=epoch.status, replicas={}, message=f"{why} epoch {epoch.epoch}")


def shard_note(epoch: AssignmentRecord, records: list[AssignmentRecord], notes: dict[str, str]) -> str:
    """`status`'s message for a sharded epoch (`notes`: shard id -> its own placement note)."""
    if epoch.status not in (PLANNED, ASSIGNED):
        return epoch.message
    by_id = {r.epoch: r for r in records if r.shard_of == epoch.epoch}
    ready = sum(shard_ready(by_id[s]) for s in epoch.shards if s in by_id)
    text = (f"sharded into {len(epoch.shards)} shards ({', '.join(epoch.shards)}): {ready} of "
            f"{len(epoch.shards)} READY; queryable when all are")
    lacking = [f"shard {s}: {notes[s]}" for s in epoch.shards if notes.get(s)]
    return "; ".join([text, *lacking])
