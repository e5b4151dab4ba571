"""Running one unit: its items from the ledger, their samples, its file, its record.

Contract
- ``unit_items(ledger, job, sources)``: the job's items, in plan order (positions
  ``[first_pos, next_pos)`` of the eligible items of ``sources``).
- ``finish_unit(job, sink, results)``: write the unit's file from its ``(item, result)`` pairs
  (written samples in plan order; nothing written when none is) and return its
  :class:`UnitRecord`; the file is in place before the record exists.
- ``write_unit(sink, seq, samples)``: the unit's file, or for a unit with no sample none, and then
  no file of an earlier, uncommitted attempt of it either (``sink.drop_unit``, where the sink has
  it): a resume whose items of that unit now all fail leaves no shard the ledger does not list.
- ``drop_units_after(sink, ledger, output, split)``: for an output whose units are cut as they are
  written (a byte budget), once all are committed: the shards an earlier, uncommitted attempt wrote
  past the last unit (several can wait for their record at once; a resume whose items now fail cuts
  fewer units) go, each only when every sample in it is an item of the plan (``sink.drop_units_after``,
  where the sink has it). Units planned ahead need none: each is rewritten or dropped itself.
- ``run_unit(job, items, maker, sink)``: the whole unit in one process (a remote worker's job):
  each item through the picklable ``maker``, then :func:`finish_unit`.
- ``commit(ledger, record)``: the ledger's record of the unit and of its items' statuses, in one
  transaction. Records may be committed in any order; the ledger's content is the same.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import islice

from shardsmith.plan.ledger import Ledger
from shardsmith.records import WRITTEN, PlannedItem, SampleResult, UnitFile, Written
from shardsmith.units.plan import UnitJob


@dataclass
class UnitRecord:
    """What a finished unit reports: its file and each of its items' terminal status."""

    job: UnitJob
    name: str  # the file (or unit) name; "" when the unit wrote nothing
    nbytes: int
    sha256: str
    count: int  # samples written
    results: list[tuple[int, str, str | None]] = field(default_factory=list)  # (idx, status, detail)
    files: tuple[UnitFile, ...] = ()  # a unit of several files (one per bucket)


def unit_items(ledger: Ledger, job: UnitJob, sources: list[int]) -> Iterable[PlannedItem]:
    return islice(ledger.items(split=job.split, sources=sources, status="ok", start_pos=job.first_pos), job.size)


def record_of(job: UnitJob, written: tuple, samples: list[tuple[str, SampleResult]],
              others: list[tuple[int, str, str | None]]) -> UnitRecord:
    """The record of a unit whose files ``written`` (a :class:`Written`, or ``(name, bytes,
    sha256)``) hold ``samples``."""
    w = Written(*written)
    return UnitRecord(job, w.name, w.nbytes, w.sha256, len(samples),
                      [(s.idx, WRITTEN, s.detail) for _, s in samples] + others, tuple(w.files))


def write_unit(sink, seq: int, samples: list[tuple[str, SampleResult]]) -> tuple:
    """``sink.write_unit(seq, samples)``; for no sample ``("", 0, "")``, once any file an earlier,
    uncommitted attempt of unit ``seq`` left is gone (see the module contract)."""
    if samples:
        return sink.write_unit(seq, samples)
    drop = getattr(sink, "drop_unit", None)
    if drop is not None:
        drop(seq)
    return ("", 0, "")


def drop_units_after(sink, ledger: Ledger, output: str, split: str) -> list[str]:
    """Remove the shards past ``output``'s last committed unit of ``split`` that an earlier, uncommitted
    attempt left (see the module contract); the names removed."""
    drop = getattr(sink, "drop_units_after", None)
    if drop is None:
        return []
    last = ledger.last_unit(output, split)
    return drop(-1 if last is None else last[0], lambda keys: len(ledger.existing_keys(keys)) == len(set(keys)))


def finish_unit(job: UnitJob, sink, results: Iterable[tuple[PlannedItem, SampleResult]]) -> UnitRecord:
    samples, others = [], []
    for item, res in results:
        if res.status == WRITTEN:
            samples.append((item.key, res))
        else:
            others.append((res.idx, res.status, res.detail))
    return record_of(job, write_unit(sink, job.seq, samples), samples, others)


def run_unit(job: UnitJob, items: Iterable[PlannedItem], maker, sink) -> UnitRecord:
    return finish_unit(job, sink, ((it, maker(it)) for it in items))


def commit(ledger: Ledger, rec: UnitRecord) -> None:
    j = rec.job
    ledger.commit_unit(output=j.output, split=j.split, seq=j.seq, name=rec.name, first_pos=j.first_pos,
                       next_pos=j.next_pos, count=rec.count, nbytes=rec.nbytes, sha256=rec.sha256,
                       results=rec.results, files=[tuple(f) for f in rec.files])
