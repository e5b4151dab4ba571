"""The ``local`` distributor: the unit jobs of one output's split on this machine.

Contract
- ``run_split(run, pool, jobs=..., ahead=...)`` writes every unit of ``run`` not yet in the ledger
  and records each (``units.job.commit``) once its file is in place; returns when all are.
- Units planned ahead (every output without a byte budget) run in the order ``jobs`` gives
  (:data:`ORDER` may reorder them: any order gives the same files and the same ledger); items
  stream to the decode workers across unit boundaries, so the pool never drains at a shard end.
- A plan still running (``ahead``) gives its rows as they are committed: units are taken in plan
  order as the rows arrive, exactly the units :func:`~shardsmith.units.plan.plan_units` gives
  once the plan is complete.
- An output with a byte budget (``max_shard_bytes``) cuts its units as its samples are written,
  in order: where a unit ends depends on the sizes of the samples before it. Once its last unit is
  recorded, the shards past it that an earlier, uncommitted attempt left go
  (:func:`~shardsmith.units.job.drop_units_after`: a resume whose items now fail cuts fewer units).
- With an encoder (``run.finisher``), a sealed unit waits for its last batches while the encoder
  goes on with the next unit's; its file is written on a writer thread, and the ledger records
  units in the order they were sealed, each once its file is in place. At most
  :data:`MAX_SEALED_UNITS` units wait for the encoder. Units being written queue on the writer
  threads without stopping the results' loop while their members take at most
  :data:`WRITING_BYTES` (always :data:`MAX_WRITING_UNITS` + 1 of them, never more than
  :data:`MAX_QUEUED_UNITS` + 1), which bounds host memory: a slow write or ``fsync`` waits in that queue
  instead of leaving the encoder without batches.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from shardsmith.formats.wds import sample_tar_bytes, tar_bytes
from shardsmith.parallel import Workers
from shardsmith.plan.ledger import Ledger
from shardsmith.records import WRITTEN
from shardsmith.units.job import commit, drop_units_after, record_of, unit_items, write_unit
from shardsmith.units.plan import UnitJob, plan_units, unit_at

MAX_SEALED_UNITS = 2  # units encoded but not yet written, at most
MAX_WRITING_UNITS = 1  # units being written besides the newest, whatever their size
MAX_QUEUED_UNITS = 8  # units being written or waiting for a writer thread, at most
WRITING_BYTES = 512 << 20  # members of the units being written; past it, MAX_WRITING_UNITS + 1 units at most

# The order the pending units of a split run in (tests shuffle it: the output must not change).
ORDER: Callable[[list[UnitJob]], list[UnitJob]] = lambda jobs: jobs  # noqa: E731


@dataclass
class SplitRun:
    """One output's split to write, with everything the distributor needs."""

    output: Any  # the recipe output
    split: str
    sources: list[int]  # source ids the output takes
    ledger: Ledger
    maker: Any  # picklable sample maker
    sink: Any
    per_unit: int
    byte_bounded: bool
    progress: Any
    finisher: Any = None  # the encoder's scheduler (outputs that need encoders)
    waits: dict[str, float] = field(default_factory=dict)  # output -> seconds blocked on shard writes

    @property
    def name(self) -> str:
        return self.output.name

    def eligible(self) -> int:
        """Planned items of this split from these sources that the output will try to write."""
        return self.ledger.eligible(self.split, self.sources)


def pending_jobs(run: SplitRun) -> tuple[list[UnitJob], int]:
    """The planned units not yet recorded, and the positions already done."""
    done = {u["seq"]: u for u in run.ledger.units(run.name, run.split)}
    jobs = plan_units(run.name, run.split, run.eligible(), run.per_unit)
    return [j for j in jobs if j.seq not in done], sum(u["next_pos"] - u["first_pos"] for u in done.values())


def run_split(run: SplitRun, pool: Workers, ahead=None, check: Callable[[], None] | None = None,
              units: Iterable[UnitJob] | None = None) -> None:
    """Write every unit of ``run`` not yet recorded (see the module contract). ``check``: called
    while waiting for a plan's rows (a model that cannot load stops the build there). ``units`` (a
    worker of :mod:`~shardsmith.distribute.gpus`: the units it claims, as it claims them): only those
    are written here, each unit's rows read whole before its first is used (an open read would pin a
    snapshot of the ledger that the unit's commit could not write past while a plan commits too)."""
    ledger = run.ledger
    if run.byte_bounded:
        last = ledger.last_unit(run.name, run.split)
        seq0, pos0 = (last[0] + 1, last[1]) if last else (0, 0)
    else:
        seq0 = pos0 = 0
    if ahead is not None:  # the plan is still running: its rows as they are committed (a fresh plan)
        total, completed = None, 0
        rows = ahead.items(ledger, split=run.split, sources=run.sources, check=check)
        per = None if run.byte_bounded else run.per_unit
        stream: Iterable = ((None if per is None else unit_at(run.name, run.split, pos, per).seq, pos, it)
                            for pos, it in enumerate(rows))
    elif run.byte_bounded:
        total, completed = run.eligible(), pos0
        rows = ledger.items(split=run.split, sources=run.sources, status="ok", start_pos=pos0)
        stream = ((None, pos, it) for pos, it in enumerate(rows, pos0))
    elif units is not None:  # the total for the progress, once the plan is complete
        total, completed = (run.eligible(), pending_jobs(run)[1]) if ledger.get_meta("plan_complete") else (None, 0)
        stream = ((j.seq, j.first_pos + k, it) for j in units
                  for k, it in enumerate(list(unit_items(ledger, j, run.sources))))
    else:
        jobs, completed = pending_jobs(run)
        total = run.eligible()
        stream = ((j.seq, j.first_pos + k, it) for j in ORDER(jobs)
                  for k, it in enumerate(unit_items(ledger, j, run.sources)))
    _Writer(run, seq0, pos0, total, completed, ahead).run(pool, stream)
    if run.byte_bounded:  # (planned units: each was rewritten, or dropped, by its own seq)
        drop_units_after(run.sink, ledger, run.name, run.split)


class _Writer:
    """The loop of :func:`run_split`: results in, units out (see the module contract)."""

    def __init__(self, run: SplitRun, seq: int, first: int, total: int | None, completed: int, ahead):
        self.run_, self.ahead = run, ahead
        self.total, self.completed = total, completed
        self.seq, self.first, self.last = seq, first, first  # the unit being filled; next position
        self.samples: list = []
        self.others: list = []
        self.nbytes = 0
        self.sealed: deque = deque()
        self.writing: deque = deque()  # (future of sink.write_unit, job, samples, others, member bytes)
        self.writing_bytes = 0
        self.ending = False
        fin = run.finisher
        self.waited = run.waits.get(run.name, 0.0) if fin is not None else 0.0
        if fin is not None:
            run.waits[run.name] = round(self.waited, 3)

    # ------------------------------------------------------------------ units out
    def _record(self, written: tuple[str, int, str], job: UnitJob, samples: list, others: list) -> None:
        commit(self.run_.ledger, record_of(job, written, samples, others))

    def _over(self, block_over: int) -> bool:
        """Whether the loop must wait for the oldest write: more than ``block_over`` units are being
        written and either more than :data:`MAX_QUEUED_UNITS` or more than :data:`WRITING_BYTES` of
        members (``block_over`` 0: every write is waited for)."""
        n = len(self.writing)
        return n > block_over and (block_over == 0 or n > MAX_QUEUED_UNITS or self.writing_bytes > WRITING_BYTES)

    def _record_written(self, block_over: int) -> None:
        while self.writing and (self._over(block_over) or self.writing[0][0].done()):
            fut, job, samples, others, nbytes = self.writing.popleft()
            t = time.perf_counter()
            written = fut.result()
            if not self.ending:  # (at the end of the output, waiting for the last shards is expected)
                self.waited += time.perf_counter() - t
                self.run_.waits[self.run_.name] = round(self.waited, 3)
            self.writing_bytes -= nbytes
            self._record(written, job, samples, others)

    def _write_ready(self, block_over: int) -> None:
        fin, sink = self.run_.finisher, self.run_.sink
        while self.sealed and (len(self.sealed) > block_over or fin.ready(self.sealed[0][0])):
            tag, job, samples, others = self.sealed.popleft()
            fin.finish_through(tag)
            fut = fin.writer.submit(write_unit, sink, job.seq, samples)  # (no sample: drops a stale file)
            nbytes = sum(len(d) for _, s in samples for d in (s.members or {}).values())
            self.writing.append((fut, job, samples, others, nbytes))
            self.writing_bytes += nbytes
            self._record_written(MAX_WRITING_UNITS)
        self._record_written(MAX_WRITING_UNITS)

    def _commit(self) -> None:
        """End the unit being filled (positions ``[first, last)``)."""
        r = self.run_
        job = UnitJob(r.name, r.split, self.seq, self.first, self.last)
        if r.finisher is None:
            written = write_unit(r.sink, job.seq, self.samples)  # (no sample: drops a stale file)
            self._record(written, job, self.samples, self.others)
        else:
            self.sealed.append((r.finisher.seal(), job, self.samples, self.others))
            self._write_ready(MAX_SEALED_UNITS)
        self.seq, self.first, self.samples, self.others, self.nbytes = self.seq + 1, self.last, [], [], 0

    # ------------------------------------------------------------------ results in
    def run(self, pool: Workers, stream: Iterable[tuple[int | None, int, Any]]) -> None:
        r, fin = self.run_, self.run_.finisher
        bounded = getattr(r.output, "max_shard_bytes", None) is not None
        tags: deque = deque()

        def feed() -> Iterator[Any]:
            for seq, pos, it in stream:
                tags.append((seq, pos))
                yield it

        started = False
        with r.progress.task(f"{r.name}/{r.split}", total=self.total, completed=self.completed) as tick:
            for item, res in pool.map(r.maker, feed()):
                seq, pos = tags.popleft()
                if self.total is None and self.ahead is not None and self.ahead.done:  # the plan has just completed: the total is known
                    self.total = r.eligible()
                    tick.set_total(self.total)
                if seq is not None and (not started or seq != self.seq):
                    if started and (self.samples or self.others):
                        self._commit()
                    self.seq, self.first, self.last = seq, pos, pos  # a planned unit starts
                started = True
                if res.status == WRITTEN:
                    if fin is None:
                        size = sample_tar_bytes(res.members, item.key)
                    else:  # members made after encoding: their exact sizes, when shards are bounded by bytes
                        size = tar_bytes(fin.member_sizes(item, res), item.key) if bounded else 0
                    if seq is None and self.samples and r.sink.unit_full(len(self.samples), self.nbytes, res,
                                                                         item.key, size):
                        self._commit()
                    self.samples.append((item.key, res))
                    self.nbytes += size
                    if fin is not None:
                        fin.add(item, res)
                        if self.sealed:
                            self._write_ready(MAX_SEALED_UNITS)
                else:
                    self.others.append((res.idx, res.status, res.detail))
                self.last = pos + 1
                tick()
            if self.total is None:  # the plan ended after the last row was taken
                tick.set_total(self.last)
            if self.samples or self.others:
                self._commit()
            if fin is not None:
                self.ending = True
                self._write_ready(0)
                self._record_written(0)
