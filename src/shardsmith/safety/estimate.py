"""How many bytes a planned build still has to write, from its ledger, before it writes them.

Why from the ledger: the plan already probed every item once; this estimate reads no item a
second time except a small deterministic sample (``SAMPLE`` per output, spread over plan order)
that is transformed and encoded with the output's own sample maker, exactly as ``scan`` does,
and scaled with :func:`shardsmith.scan.output_bytes` to the output's planned counts.

Contract
- :func:`sample_items` picks at most ``k`` planned ``ok`` items of ``sources``, spread over plan
  order, with one indexed query each (no scan of every row in Python).
- :func:`output_estimate` is pure: the bytes an image output occupies once complete (a ZIP
  twice: its staged units stay beside it), minus what committed units already hold.
- Latent outputs are not estimated (their sizes depend on the model): ``bytes`` is None.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardsmith.plan.ledger import Ledger
from shardsmith.recipe import WdsOutput, ZipOutput
from shardsmith.records import PlannedItem

SAMPLE = 16


@dataclass(frozen=True)
class OutputEstimate:
    name: str
    total: int | None  # bytes of the complete output (None: not estimated)
    committed: int  # bytes the committed units already hold

    @property
    def needed(self) -> int | None:
        return None if self.total is None else max(0, self.total - self.committed)

    def describe(self) -> str:
        if self.total is None:
            return f"output {self.name}: not estimated (latent sizes depend on the model)"
        from shardsmith.scan import human_bytes

        return (f"output {self.name}: about {human_bytes(self.total)} in all, {human_bytes(self.committed)} "
                f"already written, {human_bytes(self.needed)} to go")


def sample_items(ledger: Ledger, sources: list[int], k: int = SAMPLE) -> list[PlannedItem]:
    """At most ``k`` planned ``ok`` items of ``sources``, spread over plan order (deterministic)."""
    top = ledger.count_items()
    picked: dict[int, PlannedItem] = {}
    for i in range(k):
        lo = i * top // k
        it = next(ledger.items(status="ok", sources=sources, idx_range=(lo, top)), None)
        if it is not None:
            picked[it.idx] = it
    return [picked[i] for i in sorted(picked)]


def output_estimate(o, counts: tuple[int, int], sample_sizes: list[int | None], committed: int) -> OutputEstimate:
    """``counts``: the planned (train, holdout) items the output will try to write;
    ``sample_sizes``: bytes of each sampled item's sample (None where it would not be written)."""
    if not isinstance(o, (WdsOutput, ZipOutput)):
        return OutputEstimate(o.name, None, committed)
    from shardsmith.scan import output_bytes

    sizes = [n for n in sample_sizes if n is not None]
    frac = len(sizes) / len(sample_sizes) if sample_sizes else 0.0
    per = sum(sizes) / len(sizes) if sizes else 0.0
    est = (round(counts[0] * frac), round(counts[1] * frac))
    total = output_bytes(o, est, per, empty_splits=sum(counts) > 0)
    if isinstance(o, ZipOutput):
        total *= 2  # the staged units (.shardsmith/stage) and the ZIP assembled from them
    return OutputEstimate(o.name, round(total), committed)
