"""Plan ahead: the plan runs on a thread while the first output's shards are already written
from the rows it has committed.

Why: on a GPU build the plan (a hash and a header probe of every input) is seconds to minutes
during which the encoder would sit idle. An item's key, split and status depend only on the
items before it (``make_plan``'s ``on_batch`` contract), so rows below the committed watermark
are final and the output can start on them. Units are formed from the same rows in the same
order as after a finished plan, so the bytes are the same.

Contract
- ``PlanAhead(recipe, ledger_path, sources, workers, on_item).start()`` plans on its own thread
  and its own ledger connection; ``items(ledger, split, sources)`` (caller's thread and
  connection) yields the planned ``ok`` rows of one split in plan order as they are committed,
  blocks while the plan is behind, ends when the plan is complete, and raises the plan's error.
- ``wait()`` blocks until the plan is complete (re-raising its error); ``close()`` stops an
  unfinished plan and joins the thread (no commit is left half-done: each batch is one
  transaction).
- Refused by :func:`can_plan_ahead` (the caller plans first instead) where a row is not final
  when committed: a count-based holdout (splits assigned at the end) and one-sample mode.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from shardsmith.plan.ledger import Ledger
from shardsmith.plan.planner import make_plan
from shardsmith.records import PlannedItem


def can_plan_ahead(recipe) -> bool:
    """True where every committed row is final: a fraction (or no) holdout, not one-sample mode."""
    return recipe.split.holdout < 1 and not recipe.one_sample


class _Stopped(Exception):
    """Raised inside the plan thread by ``close()``."""


class PlanAhead:
    WINDOW = 1024  # rows read from the ledger at a time by ``items``
    def __init__(self, recipe, ledger_path: Path, sources, workers, on_item: Callable[[], None] = lambda: None):
        self.recipe, self.ledger_path, self.sources, self.workers = recipe, Path(ledger_path), sources, workers
        self.on_item = on_item
        self._cv = threading.Condition()
        self._next_idx = 0  # every row below is committed and final
        self._done = False
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self.seconds: float | None = None  # the plan's wall time, once done
        self._thread = threading.Thread(target=self._run, name="shardsmith-plan", daemon=True)

    def start(self) -> "PlanAhead":
        self._thread.start()
        return self

    def _run(self) -> None:
        t0 = time.perf_counter()
        ledger = Ledger(self.ledger_path)  # a connection of this thread's own (sqlite3 objects stay on theirs)

        def on_item() -> None:
            if self._stop.is_set():
                raise _Stopped()
            self.on_item()

        def on_batch(next_idx: int) -> None:
            with self._cv:
                self._next_idx = next_idx
                self._cv.notify_all()

        try:
            make_plan(self.recipe, ledger, self.sources, on_item=on_item, workers=self.workers, on_batch=on_batch)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer by items() / wait()
            with self._cv:
                self._error = exc
        finally:
            ledger.close()
            with self._cv:
                self.seconds = round(time.perf_counter() - t0, 3)
                self._done = True
                self._cv.notify_all()

    def _raise(self) -> None:
        if self._error is not None and not isinstance(self._error, _Stopped):
            raise self._error

    def items(self, ledger: Ledger, *, split: str, sources: list[int]) -> Iterator[PlannedItem]:
        """The planned ``ok`` rows of ``split`` from ``sources``, in plan order, as they are committed."""
        lo = 0
        while True:
            with self._cv:
                while self._next_idx <= lo and not self._done:
                    self._cv.wait()
                self._raise()
                hi, done = self._next_idx, self._done
            while lo < hi:
                # read a window to the end before yielding: a statement left open across a yield
                # holds a read snapshot, and the caller's next commit (a unit) could not upgrade
                # it once the plan thread has committed after it (SQLITE_BUSY, no wait helps)
                top = min(hi, lo + self.WINDOW)
                yield from list(ledger.items(split=split, sources=sources, status="ok", idx_range=(lo, top)))
                lo = top
            if done:
                return

    @property
    def done(self) -> bool:
        return self._done

    def wait(self) -> None:
        """Block until the plan is complete; raise its error."""
        self._thread.join()
        self._raise()
        if self._error is not None:  # stopped: no complete plan to go on with
            raise RuntimeError("the plan was stopped before it completed")

    def close(self) -> None:
        """Stop an unfinished plan (after its current item) and join the thread."""
        self._stop.set()
        self._thread.join()
