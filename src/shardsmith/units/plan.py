"""The unit plan of one output and split: a pure function of the number of eligible items.

Contract
- The eligible items of an output's split are its sources' planned ``ok`` items of that split,
  in plan order; position ``p`` is the ``p``-th of them.
- Unit ``seq`` holds positions ``[seq * per_unit, min((seq + 1) * per_unit, eligible))``: every
  unit is known before any item is transformed or encoded, whatever items later fail or are
  skipped (a unit then writes fewer samples). The same inputs give the same plan.
- A plan running ahead grows the plan without changing its units: unit ``seq`` is final once
  ``(seq + 1) * per_unit`` items are eligible or the plan is complete.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class UnitJob:
    """One unit of one output's split: its shard's ``seq`` and the eligible positions it holds.
    Small and picklable: whoever runs it reads its items from the ledger (:func:`unit_items`)."""

    output: str
    split: str
    seq: int
    first_pos: int
    next_pos: int  # exclusive

    @property
    def size(self) -> int:
        return self.next_pos - self.first_pos


def plan_units(output: str, split: str, eligible: int, per_unit: int) -> list[UnitJob]:
    """Every unit of ``eligible`` items in units of ``per_unit`` (the last one shorter)."""
    if per_unit <= 0:
        raise ValueError(f"per_unit must be positive, got {per_unit}")
    return [UnitJob(output, split, seq, lo, min(lo + per_unit, eligible))
            for seq, lo in enumerate(range(0, eligible, per_unit))]


def unit_at(output: str, split: str, pos: int, per_unit: int, eligible: int | None = None) -> UnitJob:
    """The unit holding position ``pos``; ``eligible`` None (a plan still running): its end is
    taken as full (:func:`plan_units` gives the same unit once the plan is complete)."""
    seq = pos // per_unit
    hi = (seq + 1) * per_unit
    return UnitJob(output, split, seq, seq * per_unit, hi if eligible is None else min(hi, eligible))
