"""Named steps of one micro-batch's write where a caller may act; by default nothing happens.

The sink's order (target, quarantine, then the cursor) is what makes a replay exactly-once.
The fault battery proves it by killing the driver at each of these steps; it passes its own
hooks in (`devstack/faults/hook.py`, through `python -m devstack.faults.pipeline`), so the product
holds no test hook, only the names of the steps and this do-nothing base:

* `during_target_write`: `around` wraps the target write;
* `after_target_write`: `at`, between the target and the quarantine write;
* `after_quarantine_write`: `at`, between the table writes and the cursor commit;
* `during_cursor_commit`: `cursor_store` wraps the store the cursor commit writes through.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from danube_core.metadata import MetadataStore

STEPS = ("during_target_write", "after_target_write", "after_quarantine_write", "during_cursor_commit")


class BatchHooks:
    """Does nothing at every step; a caller subclasses it to act at the steps it names."""

    def at(self, step: str) -> None:
        """The batch reached `step`."""

    @contextmanager
    def around(self, step: str) -> Iterator[None]:
        """The work of `step` runs inside this block."""
        yield

    def cursor_store(self, store: MetadataStore) -> MetadataStore:
        """The store the cursor commit writes through (`store` itself unless a hook wraps it)."""
        return store


NO_HOOKS = BatchHooks()
