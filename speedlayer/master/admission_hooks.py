"""A named point of an admission where a caller may act; by default nothing happens.

An admission persists its epoch PLANNED (the load plan with it) before it assigns workers; a
leader that dies between the two leaves a PLANNED record that the next leader resumes. The
failover tests prove it by killing the leader there: they pass their own hooks in
(`devstack/faults/master.py`, `python -m devstack.faults.master`), so the product holds no test hook
and reads no test switch, only this do-nothing base.
"""

from __future__ import annotations

from speedlayer.records import AssignmentRecord


class AdmissionHooks:
    """Does nothing; a caller subclasses it to act where an admission reaches a step."""

    def after_planned(self, record: AssignmentRecord) -> None:
        """`record` is persisted PLANNED on the leader; no worker is assigned yet."""


NO_HOOKS = AdmissionHooks()
