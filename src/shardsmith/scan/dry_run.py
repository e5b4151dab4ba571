"""The build's planner, run into a throwaway ledger.

Contract: :func:`planned` opens the recipe's sources and runs :func:`~shardsmith.plan.planner.make_plan`
(the build's probe, statuses and reasons, keys, dedup and split assignment, count holdouts
included) into a :meth:`~shardsmith.plan.ledger.Ledger.temporary` ledger and yields it with the
sources' :class:`~shardsmith.records.SourceInfo`. That ledger has no file name (nothing appears
in any folder, a scanned one included), keeps host memory bounded (SQLite spills it to an
unlinked file as it grows; its page cache and sorter memory are capped at ``CACHE_KIB``) and is gone when the block ends, whatever happened. Every item is
planned, whatever ``one_sample`` says (scan describes all the data).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from shardsmith.plan.ledger import Ledger
from shardsmith.plan.planner import make_plan
from shardsmith.recipe import Recipe
from shardsmith.records import SourceInfo
from shardsmith.sources import open_sources


CACHE_KIB = 256  # the throwaway ledger's SQLite page cache (and sorter memory) in KiB


@dataclass(frozen=True)
class DryRun:
    ledger: Ledger  # the complete plan: one ``items`` row per input, as a build records it
    sources: list[SourceInfo]  # in recipe order; ``items.source`` indexes it


@contextlib.contextmanager
def planned(recipe: Recipe, progress=None) -> Iterator[DryRun]:
    """Plan ``recipe`` as a build would, into a ledger deleted when the block ends. ``progress``: a
    :class:`~shardsmith.progress.Progress` whose ``plan`` task counts the listed items (its total
    from :func:`~shardsmith.sources.base.count_listed`, counted on a thread while the plan runs)."""
    from shardsmith.progress import Progress, total_in_background
    from shardsmith.sources.base import count_listed

    opened = open_sources(recipe)
    ledger = Ledger.temporary()
    # SQLite's page cache and its sorter's in-memory runs (GROUP BY / ORDER BY without an index) are
    # each allowed up to cache_size (2 MiB by default), filled only by a large plan: keep them small
    ledger.db.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
    progress = progress or Progress(quiet=True)
    try:
        with progress.task("plan", total=None) as tick:
            with total_in_background(tick, lambda: count_listed(opened)):
                make_plan(recipe.model_copy(update={"one_sample": False}), ledger, opened, on_item=tick)
        yield DryRun(ledger, [info for info, _ in opened])
    finally:
        ledger.close()
