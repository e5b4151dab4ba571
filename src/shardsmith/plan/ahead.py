"""Plan ahead: the plan runs in a process of its own while the first output's shards are
already written from the rows it has committed.

Why: on a GPU build the plan (a hash and a header probe of every input) takes seconds to
minutes during which the encoder would sit idle. An item's key, split and status depend only
on the items before it (``make_plan``'s ``on_batch`` contract), so rows below the committed
watermark are final and the output can start on them. Units are formed from the same rows in
the same order as after a finished plan, so the bytes are the same. A process, not a thread:
the plan's Python work per item (rows, keys, SQLite) would otherwise take the interpreter lock
from the threads that keep the GPU fed (measured on the H200: a plan thread made the plan 2.3x
slower and the encoding 4.5 % slower, which ate most of the gain).

Contract
- ``PlanAhead(recipe, ledger_path, sources, probe_workers).start()`` forks the plan process
  (call it before the build starts other threads or loads models: a fork copies only the
  calling thread); it plans with its own ledger connection and ``probe_workers`` probe
  processes. ``listen(tick)`` then starts the thread that relays its progress.
- ``items(ledger, split, sources)`` (the caller's connection) yields the planned ``ok`` rows of
  one split in plan order as they are committed, blocks while the plan is behind, ends when the
  plan is complete, and raises the plan's error.
- ``wait(check)`` blocks until the plan is complete (re-raising its error); ``close()`` stops an
  unfinished plan after its current item and joins the process (each batch is one
  transaction, so nothing is left half-committed).
- Refused by :func:`can_plan_ahead` (the caller plans first instead) where a row is not final
  when committed: a count-based holdout (splits assigned at the end) and one-sample mode.
- Apart: a ``PlanAhead`` whose ``output`` is None is waited for before any output starts (a plan-first
  build whose plan runs in its own process, so that its rows do not share the interpreter lock with the
  models' imports and load in the build's process).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

from shardsmith.parallel import fork_safe_gc
from shardsmith.plan.ledger import Ledger
from shardsmith.plan.planner import make_plan
from shardsmith.records import PlannedItem


def can_plan_ahead(recipe) -> bool:
    """True where every committed row is final: a fraction (or no) holdout, not one-sample mode."""
    return recipe.split.holdout < 1 and not recipe.one_sample


class _Stopped(Exception):
    """Raised inside the plan process once ``close()`` asked it to stop."""


def _plan_process(recipe, ledger_path: Path, sources, probe_workers: int, conn, stop,
                  starter_is_main: bool = True) -> None:
    """The plan process: ``make_plan`` with a ledger connection and probe workers of its own;
    reports ``("batch", next_idx, n)`` after each commit, then ``("done", seconds)`` or
    ``("error", exception)``."""
    from shardsmith.parallel import Workers, exit_with_parent

    t0 = time.perf_counter()
    parent = os.getppid()
    # killed (kill -9), the build takes its plan process with it, and that its probe workers
    exit_with_parent(parent, pdeathsig=starter_is_main)
    pool = ledger = None
    try:
        pool = Workers(probe_workers)
        ledger = Ledger(ledger_path)
        last = [0]

        def on_item() -> None:
            # stop when asked, and when the build process is gone (killed): an orphan planning on
            # would write rows under the next run's own plan of the same ledger
            if stop.is_set() or os.getppid() != parent:
                raise _Stopped()

        def on_batch(next_idx: int) -> None:
            conn.send(("batch", next_idx, next_idx - last[0]))
            last[0] = next_idx

        make_plan(recipe, ledger, sources, on_item=on_item, workers=pool, on_batch=on_batch)
        conn.send(("done", round(time.perf_counter() - t0, 3)))
    except BaseException as exc:  # noqa: BLE001 - re-raised in the build process
        exc.__notes__ = [*getattr(exc, "__notes__", []), "in the plan process:\n" + traceback.format_exc()]
        try:
            conn.send(("error", exc))
        except Exception:  # noqa: BLE001 - an exception that does not pickle: its text does
            conn.send(("error", RuntimeError(f"the plan failed: {type(exc).__name__}: {exc}\n"
                                             + traceback.format_exc())))
    finally:
        if pool is not None:
            pool.close()
        if ledger is not None:
            ledger.close()
        conn.close()


class PlanAhead:
    WINDOW = 1024  # rows read from the ledger at a time by ``items``

    def __init__(self, recipe, ledger_path: Path, sources, probe_workers: int = 1):
        self.recipe, self.ledger_path, self.sources = recipe, Path(ledger_path), sources
        self.probe_workers = probe_workers
        self._cv = threading.Condition()
        self._next_idx = 0  # every row below is committed and final
        self._done = False
        self._error: BaseException | None = None
        self.seconds: float | None = None  # the plan's wall time, once done
        self.output = None  # the output that starts on the committed rows (the build sets it)
        self._proc = self._relay = None

    def start(self) -> "PlanAhead":
        ctx = mp.get_context("fork")  # the sources' item streams are closures: inherited, not pickled
        self._recv, send = ctx.Pipe(duplex=False)
        self._stop = ctx.Event()
        self._proc = ctx.Process(target=_plan_process, name="shardsmith-plan",
                                 args=(self.recipe, self.ledger_path, self.sources, self.probe_workers, send,
                                       self._stop, threading.current_thread() is threading.main_thread()))
        with fork_safe_gc():
            self._proc.start()
        send.close()
        return self

    def listen(self, tick=None) -> "PlanAhead":
        """Start relaying the plan's progress (``tick.advance(n)`` per batch when given)."""
        self._relay = threading.Thread(target=self._run_relay, args=(tick,), name="shardsmith-plan-relay",
                                       daemon=True)
        self._relay.start()
        return self

    def _run_relay(self, tick) -> None:
        while True:
            try:
                msg = self._recv.recv()
            except (EOFError, OSError):
                msg = ("error", RuntimeError(f"the plan process ended without finishing the plan "
                                             f"(exit code {self._proc.exitcode if self._proc else None})"))
            with self._cv:
                if msg[0] == "batch":
                    self._next_idx = msg[1]
                elif msg[0] == "done":
                    self.seconds, self._done = msg[1], True
                else:
                    self._error, self._done = msg[1], True
                self._cv.notify_all()
            if msg[0] == "batch" and tick is not None:
                tick.advance(msg[2])
            if msg[0] != "batch":
                return

    def _raise(self) -> None:
        if self._error is not None and not isinstance(self._error, _Stopped):
            raise self._error

    def items(self, ledger: Ledger, *, split: str, sources: list[int],
              check: Callable[[], None] | None = None) -> Iterator[PlannedItem]:
        """The planned ``ok`` rows of ``split`` from ``sources``, in plan order, as they are
        committed. ``check()`` runs at least every 0.2 s while it waits (it may raise to stop)."""
        lo = 0
        if self._relay is None:
            self.listen()
        while True:
            with self._cv:
                while self._next_idx <= lo and not self._done:
                    if check is not None:
                        check()
                    self._cv.wait(0.2)
                self._raise()
                hi, done = self._next_idx, self._done
            while lo < hi:
                # read a window to the end before yielding: a statement left open across a yield
                # holds a read snapshot, and the caller's next commit (a unit) could not upgrade
                # it once the plan has committed after it (SQLITE_BUSY, no wait helps)
                top = min(hi, lo + self.WINDOW)
                yield from list(ledger.items(split=split, sources=sources, status="ok", idx_range=(lo, top)))
                lo = top
            if done:
                return

    @property
    def done(self) -> bool:
        return self._done

    def wait(self, check: Callable[[], None] | None = None) -> None:
        """Block until the plan is complete; raise its error. ``check()`` runs at least every 0.2 s while
        it waits (it may raise to stop)."""
        if self._relay is None:
            self.listen()
        with self._cv:
            while not self._done:
                if check is not None:
                    check()
                self._cv.wait(0.2 if check is not None else None)
        self._raise()
        if self._error is not None:  # stopped: no complete plan to go on with
            raise RuntimeError("the plan was stopped before it completed")

    def close(self) -> None:
        """Stop an unfinished plan (after its current item) and join its process."""
        if self._proc is None:
            return
        self._stop.set()
        self._proc.join(30)
        if self._proc.is_alive():  # stuck (a hung read): SQLite keeps the last committed batch
            self._proc.terminate()
            self._proc.join()
        if self._relay is not None:
            self._relay.join(5)
        self._recv.close()
