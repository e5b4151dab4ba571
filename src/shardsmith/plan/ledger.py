"""The ledger: an SQLite database inside the output folder that accounts for every input.

Tables
- ``meta(key, value)``: recipe fingerprint and canonical recipe, version, plan completion.
- ``items``: one row per planned input (see :class:`~shardsmith.records.PlannedItem`); its
  ``media`` column is the JSON of every role's probed file (added to older ledgers on open).
- ``results(output, idx, status, detail, shard)``: terminal status of each item per output,
  written in the same transaction that commits the shard holding it.
- ``shards(output, split, seq, name, first_pos, next_pos, count, bytes, sha256)``: committed
  units of work; ``next_pos`` is where the next unit starts in the eligible-item order.
- ``unit_files(output, split, seq, name, bucket, count, bytes, sha256, frames_used,
  frames_available, area_kept)``: what a latent output's unit wrote per bucket (a multi-bucket
  WebDataset's shard ``<bucket>/NNNNN.tar``, or a ``.precomputed/`` unit's files of one bucket,
  ``<bucket>@unitNNNNN``), committed with the unit; ``frames_*`` and ``area_kept`` (the sum over
  its samples of the share of the source area the crop keeps) feed the per-bucket summary.

The ledger is the only source of truth for resume: a unit is done iff its row exists, and
a row is written only after the unit's file was renamed into place.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from shardsmith.records import TARGET, MediaRef, PlannedItem, media_from_json, media_to_json
from shardsmith.split.assign import TRAIN

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS items (
    idx INTEGER PRIMARY KEY,
    item_id TEXT NOT NULL UNIQUE,
    key TEXT NOT NULL UNIQUE,
    source INTEGER NOT NULL,
    path TEXT NOT NULL,
    relpath TEXT NOT NULL,
    caption TEXT,
    label INTEGER,
    label_name TEXT,
    meta TEXT NOT NULL,
    sha256 TEXT,
    size_bytes INTEGER,
    kind TEXT NOT NULL,
    width INTEGER,
    height INTEGER,
    image_format TEXT,
    mode TEXT,
    split TEXT NOT NULL,
    plan_status TEXT NOT NULL,
    detail TEXT,
    dup_of TEXT,
    media TEXT
);
CREATE INDEX IF NOT EXISTS items_sha ON items(sha256);
CREATE INDEX IF NOT EXISTS items_split ON items(split, idx);
CREATE TABLE IF NOT EXISTS results (
    output TEXT NOT NULL,
    idx INTEGER NOT NULL,
    status TEXT NOT NULL,
    detail TEXT,
    shard TEXT,
    PRIMARY KEY (output, idx)
);
CREATE TABLE IF NOT EXISTS claims (
    output TEXT NOT NULL,
    split TEXT NOT NULL,
    seq INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    PRIMARY KEY (output, split, seq)
);
CREATE TABLE IF NOT EXISTS shards (
    output TEXT NOT NULL,
    split TEXT NOT NULL,
    seq INTEGER NOT NULL,
    name TEXT NOT NULL,
    first_pos INTEGER NOT NULL,
    next_pos INTEGER NOT NULL,
    count INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    PRIMARY KEY (output, split, seq)
);
CREATE TABLE IF NOT EXISTS unit_files (
    output TEXT NOT NULL,
    split TEXT NOT NULL,
    seq INTEGER NOT NULL,
    name TEXT NOT NULL,
    bucket TEXT NOT NULL,
    count INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    frames_used INTEGER NOT NULL,
    frames_available INTEGER NOT NULL,
    area_kept REAL NOT NULL,
    PRIMARY KEY (output, split, name)
);
"""

# items that some output did not write (failed or skipped there)
_NOT_WRITTEN = "SELECT idx FROM results WHERE status != 'written'"

_ITEM_COLS = (
    "idx item_id key source path relpath caption label label_name meta sha256 size_bytes kind "
    "width height image_format mode split plan_status detail dup_of media"
).split()


def is_read_only_error(exc: sqlite3.Error) -> bool:
    """Whether SQLite refused ``exc``'s operation because the ledger or its folder cannot be written ("attempt to
    write a readonly database", "unable to open database file")."""
    return "readonly" in str(exc) or "unable to open" in str(exc)


class Ledger:
    """Thin typed wrapper over the SQLite file; one instance per process."""

    def __init__(self, path: str | Path):
        self.path: Path | None = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._open(str(self.path))

    @classmethod
    def temporary(cls) -> Ledger:
        """A ledger with no file name (SQLite's temporary database: in memory while small, then in
        an unlinked file), gone when closed; ``path`` is None. For dry runs that leave nothing."""
        led = cls.__new__(cls)
        led.path = None
        led._open("")
        return led

    @classmethod
    def _immutable(cls, path: Path) -> Ledger:
        """The ledger at ``path`` opened for reading only, as an immutable file (SQLite then needs no
        ``-shm``/``-wal`` beside it, which a read-only folder cannot hold). Only for a caller that holds the
        folder's lock, so that nothing writes it meanwhile."""
        from urllib.parse import quote  # noqa: PLC0415

        led = cls.__new__(cls)
        led.path = path
        led.db = sqlite3.connect(f"file:{quote(str(path.resolve()))}?immutable=1", uri=True, isolation_level=None)
        return led

    def _open(self, name: str) -> None:
        self.db = sqlite3.connect(name, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(_SCHEMA)
        self._add_media_column()

    def _add_media_column(self) -> None:
        """A ledger written before roles has no ``items.media``: add it (NULL in old rows, which
        read back with their target rebuilt from the flat columns)."""
        cols = {r[1] for r in self.db.execute("PRAGMA table_info(items)")}
        if "media" not in cols:
            try:
                self.db.execute("ALTER TABLE items ADD COLUMN media TEXT")
            except sqlite3.OperationalError as exc:  # another connection added it first
                if "duplicate column" not in str(exc):
                    raise

    def close(self) -> None:
        self.db.close()

    @classmethod
    def peek(cls, path: str | Path, *keys: str) -> tuple[Any, ...]:
        """Read meta ``keys`` of the ledger at ``path`` (all None when there is none; never creates one)."""
        if not Path(path).exists():
            return (None,) * len(keys)
        try:
            led = cls(path)
        except sqlite3.OperationalError as exc:  # a finished dataset made read-only: read it as it is
            if not is_read_only_error(exc):
                raise
            led = cls._immutable(Path(path))
        try:
            return tuple(led.get_meta(k) for k in keys)
        finally:
            led.close()

    @classmethod
    def holds_items(cls, path: str | Path) -> bool:
        """Whether the ledger at ``path`` has planned any item (False when there is none)."""
        if not Path(path).exists():
            return False
        led = cls(path)
        try:
            return led.count_items() > 0
        finally:
            led.close()

    @classmethod
    def never_started(cls, path: str | Path) -> bool:
        """True for a ledger that holds no meta, item, result or unit: a build killed right after
        creating it. Such a folder holds nothing of any recipe and may be built into."""
        led = cls(path)
        try:
            return not any(led.db.execute(f"SELECT 1 FROM {t} LIMIT 1").fetchone()
                           for t in ("meta", "items", "results", "shards"))
        finally:
            led.close()

    # -- meta -------------------------------------------------------------------------
    def get_meta(self, key: str) -> Any:
        row = self.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def set_meta(self, key: str, value: Any) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, json.dumps(value, sort_keys=True)))

    def keep_meta(self, key: str, value: Any) -> Any:
        """Record ``value`` under ``key`` unless a value is there (another process may have written one
        first); returns the value that holds."""
        self.db.execute("INSERT OR IGNORE INTO meta VALUES (?, ?)", (key, json.dumps(value, sort_keys=True)))
        return self.get_meta(key)

    def kept_choice(self, key: str, before: str, choose: Callable[[], Any]) -> Any:
        """A build-wide choice as this build began, so that every resume makes it again: the value
        recorded under ``key``; else ``before`` when the ledger already holds results (a build begun
        before the choice was recorded); else ``choose()``. A new answer is recorded."""
        chosen = self.get_meta(key)
        if chosen is None:
            chosen = before if self.has_results() else choose()
            self.set_meta(key, chosen)
        return chosen

    @contextlib.contextmanager
    def relaxed_sync(self):
        """Commits inside do not wait for the disk (``synchronous=NORMAL``: an application crash
        loses nothing, a power cut may lose the last commits). For work that is redone anyway when
        it was not completed (the plan, which is only trusted once ``plan_complete`` is written
        after this block, with full sync again)."""
        self.db.execute("PRAGMA synchronous=NORMAL")
        try:
            yield
        finally:
            self.db.execute("PRAGMA synchronous=FULL")

    # -- items ------------------------------------------------------------------------
    def reset_plan(self) -> None:
        with self.transaction():
            self.db.execute("DELETE FROM items")
            self.db.execute("DELETE FROM results")
            self.db.execute("DELETE FROM shards")
            self.db.execute("DELETE FROM unit_files")
            self.db.execute("DELETE FROM meta WHERE key IN ('plan_complete', 'written_ahead')")

    def add_items(self, items: Iterable[PlannedItem]) -> None:
        rows = []
        for it in items:
            d = it.__dict__.copy()
            d["meta"] = json.dumps(d["meta"], sort_keys=True, ensure_ascii=False)
            d["media"] = media_to_json(d["media"])
            rows.append(tuple(d[c] for c in _ITEM_COLS))
        self.db.executemany(f"INSERT INTO items ({','.join(_ITEM_COLS)}) VALUES ({','.join('?' * len(_ITEM_COLS))})", rows)

    def _select_in(self, sql: str, values: Iterable[Any]) -> Iterator[tuple]:
        """Rows of ``sql``, whose ``{}`` is an ``IN`` list, over ``values``: one query per 500."""
        values = list(values)
        for i in range(0, len(values), 500):
            part = values[i:i + 500]
            yield from self.db.execute(sql.format(",".join("?" * len(part))), part)

    def existing_keys(self, keys: Iterable[str]) -> set[str]:
        """Those of ``keys`` the ledger already holds."""
        return {r[0] for r in self._select_in("SELECT key FROM items WHERE key IN ({})", keys)}

    def firsts_with_sha(self, shas: Iterable[str]) -> dict[str, tuple[str, str]]:
        """sha -> (item_id, split) of the earliest usable item with those bytes, for those of
        ``shas`` the ledger holds."""
        rows = self._select_in("SELECT sha256, item_id, split, MIN(idx) FROM items "
                               "WHERE plan_status='ok' AND sha256 IN ({}) GROUP BY sha256", shas)
        return {sha: (item_id, split) for sha, item_id, split, _ in rows}

    def set_split(self, idx: int, split: str) -> None:
        self.db.execute("UPDATE items SET split=? WHERE idx=?", (split, idx))

    @staticmethod
    def _item(row: tuple) -> PlannedItem:
        d = dict(zip(_ITEM_COLS, row))
        d["meta"] = json.loads(d["meta"])
        if d["media"] is not None:
            d["media"] = media_from_json(d["media"])
        elif d["path"]:  # a row planned before roles: its target, from the flat columns
            d["media"] = {TARGET: MediaRef(d["path"], d["relpath"], d["kind"], d["size_bytes"], d["sha256"],
                                           d["width"], d["height"], d["image_format"], d["mode"])}
        else:
            d["media"] = {}
        return PlannedItem(**d)

    def items(self, *, split: str | None = None, sources: list[int] | None = None,
              status: str | None = None, start_pos: int = 0,
              idx_range: tuple[int, int] | None = None) -> Iterator[PlannedItem]:
        """Stream items in plan order, optionally filtered; ``start_pos`` skips that many;
        ``idx_range=(lo, hi)`` keeps ``lo <= idx < hi``."""
        sql, args = f"SELECT {','.join(_ITEM_COLS)} FROM items WHERE 1=1", []
        if idx_range is not None:
            sql += " AND idx >= ? AND idx < ?"
            args += list(idx_range)
        if split is not None:
            sql += " AND split=?"
            args.append(split)
        if status is not None:
            sql += " AND plan_status=?"
            args.append(status)
        if sources is not None:
            sql += f" AND source IN ({','.join('?' * len(sources))})"
            args += sources
        sql += " ORDER BY idx LIMIT -1 OFFSET ?"
        args.append(start_pos)
        cur = self.db.cursor()
        cur.arraysize = 256
        cur.execute(sql, args)
        while rows := cur.fetchmany():
            for r in rows:
                yield self._item(r)

    def unwritten_items(self, output: str, split: str, sources: list[int]) -> Iterator[PlannedItem]:
        """The planned ``ok`` items of ``split`` from ``sources`` that a committed unit of ``output`` did not
        write (failed or skipped there), in plan order."""
        yield from (self._item(r) for r in self.db.execute(
            f"SELECT {','.join('i.' + c for c in _ITEM_COLS)} FROM items i JOIN results r ON r.idx=i.idx AND "
            f"r.output=? WHERE i.split=? AND i.plan_status='ok' AND r.status != 'written' AND i.source IN "
            f"({','.join('?' * len(sources))}) ORDER BY i.idx", [output, split, *sources]))

    def plan_outcomes(self, sources: list[int]) -> list[tuple[int, str, str | None]]:
        """``(idx, status, detail)`` of the items of ``sources`` that the plan did not pass
        (unreadable, duplicate ...), in plan order: selected in SQL, not by reading every item."""
        return self.db.execute(
            f"SELECT idx, plan_status, detail FROM items WHERE plan_status != 'ok' "
            f"AND source IN ({','.join('?' * len(sources))}) ORDER BY idx", sources).fetchall()

    def has_results(self) -> bool:
        """Whether any unit has been committed (a build under way, not a fresh one)."""
        return self.db.execute("SELECT 1 FROM results LIMIT 1").fetchone() is not None

    def count_items(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM items").fetchone()[0]

    def planned_kinds(self, sources: list[int]) -> set[str]:
        """The media kinds of the planned ``ok`` items of ``sources``."""
        return {k for (k,) in self.db.execute(
            f"SELECT DISTINCT kind FROM items WHERE plan_status='ok' AND source IN ({','.join('?' * len(sources))})",
            sources)}

    def items_of_source(self, source: int) -> int:
        """Items planned from source ``source`` (every status)."""
        return self.db.execute("SELECT COUNT(*) FROM items WHERE source=?", (source,)).fetchone()[0]

    def eligible(self, split: str | None, sources: list[int]) -> int:
        """Planned ``ok`` items of ``split`` (None: every split) from ``sources``: those an output of them tries
        to write (the positions of its unit plan)."""
        where = "" if split is None else "split=? AND "
        return self.db.execute(
            f"SELECT COUNT(*) FROM items WHERE {where}plan_status='ok' AND source IN ({','.join('?' * len(sources))})",
            [*([] if split is None else [split]), *sources]).fetchone()[0]

    def result_details(self, output: str, split: str, status_like: str, detail_like: str = "%",
                       limit: int | None = None) -> list[tuple[str, str, str | None]]:
        """``(item_id, status, detail)`` of ``output``'s results in ``split`` whose status and detail
        match the SQL patterns, in plan order (at most ``limit``)."""
        sql = ("SELECT i.item_id, r.status, r.detail FROM results r JOIN items i ON i.idx = r.idx WHERE r.output=? "
               "AND i.split=? AND r.status LIKE ? AND COALESCE(r.detail, '') LIKE ? ORDER BY r.idx")
        args: list = [output, split, status_like, detail_like]
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        return self.db.execute(sql, args).fetchall()

    def status_counts(self, output: str, split: str, status_like: str = "%",
                      detail_like: str = "%") -> dict[str, int]:
        """status -> count of ``output``'s results in ``split`` matching the SQL patterns."""
        rows = self.db.execute(
            "SELECT r.status, COUNT(*) FROM results r JOIN items i ON i.idx = r.idx WHERE r.output=? AND i.split=? "
            "AND r.status LIKE ? AND COALESCE(r.detail, '') LIKE ? GROUP BY r.status",
            (output, split, status_like, detail_like)).fetchall()
        return dict(rows)

    def any_labelled(self, sources: list[int]) -> bool:
        """Whether any planned item of ``sources`` has a class label (a ZIP of them is then
        class-conditional)."""
        return self.db.execute(f"SELECT 1 FROM items WHERE label IS NOT NULL AND source IN "
                               f"({','.join('?' * len(sources))}) LIMIT 1", sources).fetchone() is not None

    # -- shards and results -------------------------------------------------------------
    def transaction(self):
        return _Tx(self.db)

    def commit_unit(self, *, output: str, split: str, seq: int, name: str, first_pos: int, next_pos: int,
                    count: int, nbytes: int, sha256: str, results: list[tuple[int, str, str | None]],
                    files: Iterable[tuple] = ()) -> None:
        """Record one committed unit (after its files were renamed into place), its items and,
        for a unit of several files, each file ``(name, bucket, count, bytes, sha256, frames_used,
        frames_available, area_kept)``; one transaction."""
        with self.transaction():
            self.db.execute("INSERT INTO shards VALUES (?,?,?,?,?,?,?,?,?)",
                            (output, split, seq, name, first_pos, next_pos, count, nbytes, sha256))
            self.db.executemany("INSERT INTO results VALUES (?,?,?,?,?)",
                                [(output, idx, st, det, name if st == "written" else None)
                                 for idx, st, det in results])
            self.db.executemany("INSERT INTO unit_files VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                                [(output, split, seq, *f) for f in files])

    def unit_files(self, output: str, split: str) -> list[dict[str, Any]]:
        """The files of the multi-file units of ``output``'s ``split``, by bucket then unit."""
        cols = ("seq", "name", "bucket", "count", "bytes", "sha256", "frames_used", "frames_available", "area_kept")
        rows = self.db.execute(f"SELECT {','.join(cols)} FROM unit_files WHERE output=? AND split=? "
                               "ORDER BY bucket, seq", (output, split)).fetchall()
        return [dict(zip(cols, r)) for r in rows]

    def record_results(self, output: str, results: list[tuple[int, str, str | None]]) -> None:
        """Terminal statuses decided without a unit (plan failures, items outside the output)."""
        with self.transaction():
            self.db.executemany("INSERT OR REPLACE INTO results VALUES (?,?,?,?,NULL)",
                                [(output, idx, st, det) for idx, st, det in results])

    def last_unit(self, output: str, split: str) -> tuple[int, int] | None:
        """(seq, next_pos) of the last committed unit, or None."""
        row = self.db.execute("SELECT seq, next_pos FROM shards WHERE output=? AND split=? ORDER BY seq DESC LIMIT 1",
                              (output, split)).fetchone()
        return None if row is None else (row[0], row[1])

    def units(self, output: str, split: str) -> list[dict[str, Any]]:
        rows = self.db.execute("SELECT seq, name, first_pos, next_pos, count, bytes, sha256 FROM shards "
                               "WHERE output=? AND split=? ORDER BY seq", (output, split)).fetchall()
        return [dict(zip(("seq", "name", "first_pos", "next_pos", "count", "bytes", "sha256"), r)) for r in rows]

    def written(self, output: str, split: str, shard: str | None = None) -> Iterator[tuple[int, str, int | None]]:
        """(idx, shard, label) of written items of one output/split in plan order."""
        sql = ("SELECT r.idx, r.shard, i.label FROM results r JOIN items i ON i.idx=r.idx "
               "WHERE r.output=? AND i.split=? AND r.status='written'")
        args: list[Any] = [output, split]
        if shard is not None:
            sql += " AND r.shard=?"
            args.append(shard)
        yield from self.db.execute(sql + " ORDER BY r.idx", args)

    def clear_claims(self, output: str, split: str) -> None:
        """Forget every claim on ``output``'s ``split`` (before its units are handed out again)."""
        with self.transaction():
            self.db.execute("DELETE FROM claims WHERE output=? AND split=?", (output, split))

    def claim(self, output: str, split: str, seq: int, rank: int) -> bool:
        """Claim unit ``seq`` for worker ``rank``: True for the first worker to ask, False after."""
        cur = self.db.execute("INSERT OR IGNORE INTO claims VALUES (?,?,?,?)", (output, split, seq, rank))
        return cur.rowcount == 1

    def written_ids(self, output: str, split: str) -> Iterator[tuple[str, str, str]]:
        """(shard, key, item_id) of written items of one output/split, in plan order."""
        yield from self.db.execute(
            "SELECT r.shard, i.key, i.item_id FROM results r JOIN items i ON i.idx=r.idx "
            "WHERE r.output=? AND i.split=? AND r.status='written' ORDER BY r.idx", (output, split))

    def status_rows(self, output: str, *, written: bool = True) -> Iterator[tuple[str, str, str, str | None]]:
        """(split, item_id, status, detail) for every item that has a result in ``output``
        (``written=False``: only those not written)."""
        yield from self.db.execute(
            "SELECT i.split, i.item_id, r.status, r.detail FROM results r JOIN items i ON i.idx=r.idx "
            f"WHERE r.output=? {'' if written else 'AND r.status != ?'} ORDER BY r.idx",
            (output,) if written else (output, "written"))

    def written_counts(self, output: str | None = None, sources: list[int] | None = None) -> dict[str, int]:
        """{split: n} of the items ``output`` wrote. ``output=None``: of the items of ``sources``
        (those some output takes) that no output failed or skipped, i.e. whose worst status
        across outputs is written (every such item has a result in each output taking it: the
        invariant ``missing_results`` checks)."""
        if output is not None:
            # items in split order (their index), each result looked up: no temporary B-tree of
            # every written item for the GROUP BY
            rows = self.db.execute("SELECT i.split, COUNT(*) FROM items i INDEXED BY items_split CROSS JOIN "
                                   "results r ON r.output=? AND r.idx=i.idx WHERE r.status='written' "
                                   "GROUP BY i.split", (output,))
        else:
            rows = self.db.execute(f"SELECT split, COUNT(*) FROM items WHERE source IN ({','.join('?' * len(sources))}) "
                                   f"AND idx NOT IN ({_NOT_WRITTEN}) GROUP BY split", list(sources))
        return dict(sorted(rows, key=lambda r: (r[0] != TRAIN, r[0])))

    def not_all_written(self, sources: list[int]) -> Iterator[tuple[int, str, str, str | None, str | None]]:
        """(idx, split, item_id, status, detail) per result (status None where the item has none)
        of the items that are not counted by ``written_counts(None, sources)``, in plan order."""
        yield from self.db.execute(
            "SELECT i.idx, i.split, i.item_id, r.status, r.detail FROM items i LEFT JOIN results r ON r.idx=i.idx "
            f"WHERE i.idx IN ({_NOT_WRITTEN}) OR i.source NOT IN ({','.join('?' * len(sources))}) ORDER BY i.idx",
            list(sources))

    def missing_results(self, output: str, sources: list[int] | None) -> int:
        sql = "SELECT COUNT(*) FROM items i LEFT JOIN results r ON r.idx=i.idx AND r.output=? WHERE r.idx IS NULL"
        args: list[Any] = [output]
        if sources is not None:
            sql += f" AND i.source IN ({','.join('?' * len(sources))})"
            args += sources
        return self.db.execute(sql, args).fetchone()[0]


class _Tx:
    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def __enter__(self):
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type, exc, tb):
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")
        return False
