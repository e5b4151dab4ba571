"""The build's planner, run into a throwaway ledger.

Contract: :func:`planned` opens the recipe's sources and runs :func:`~shardsmith.plan.planner.make_plan`
(the build's probe, statuses and reasons, keys, dedup and split assignment, count holdouts
included) into a ledger in a fresh temporary folder, outside the sources and any output, and
yields it with the sources' :class:`~shardsmith.records.SourceInfo`. The ledger's files and
the folder are removed on exit, whatever happened; nothing else is written. A file rather than
``:memory:`` keeps host memory bounded whatever the dataset size.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from shardsmith.plan.ledger import Ledger
from shardsmith.plan.planner import make_plan
from shardsmith.recipe import Recipe
from shardsmith.records import SourceInfo
from shardsmith.sources import open_sources

LEDGER = "ledger.sqlite"
#: the files SQLite may keep beside a WAL-mode database (listed, not walked: nothing else is there)
SQLITE_SUFFIXES = ("", "-wal", "-shm", "-journal")


@dataclass(frozen=True)
class DryRun:
    ledger: Ledger  # the complete plan: one ``items`` row per input, as a build records it
    sources: list[SourceInfo]  # in recipe order; ``items.source`` indexes it


@contextlib.contextmanager
def planned(recipe: Recipe) -> Iterator[DryRun]:
    """Plan ``recipe`` as a build would, into a ledger deleted when the block ends."""
    opened = open_sources(recipe)
    folder = Path(tempfile.mkdtemp(prefix="shardsmith-scan-"))
    path = folder / LEDGER
    try:
        ledger = Ledger(path)
        try:
            make_plan(recipe, ledger, opened)
            ledger.db.execute("PRAGMA synchronous=OFF")  # what scan adds is thrown away with the file
            yield DryRun(ledger, [info for info, _ in opened])
        finally:
            ledger.close()
    finally:
        for suffix in SQLITE_SUFFIXES:
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        folder.rmdir()
