"""Metadata table source: CSV, JSON (list of objects), JSONL or Parquet.

Column roles come from ``columns:`` (or are detected: media/file/path/image/file_name for the
target, caption/text/prompt, label). Partner roles (``source``, ``reference``, ``mask``,
``audio``, ``camera``) are only taken from ``columns:``; each row's partner files land in
``Item.media`` by role. Other columns are kept as per-sample metadata. Every media path (target
and partners) resolves against the table's own folder; a path that lands outside that folder
once symlinks are resolved (``..``, an absolute path, a link) is refused per row, unopened,
unless ``allow_outside_paths: true``. A bad row (missing file, no media path, unparsable line,
a CSV row with more cells than the header: ``bad_row``) becomes that row's ``failed:<reason>``; a
path that names a folder, a named pipe or a device is ``failed:not_a_regular_file``, never opened; a
CSV header that names a column twice is refused (:class:`SourceError`); a CSV metadata cell that
spells a number is kept as that number; a partner that is missing or empty is
``failed:missing_<role>``, one the path rules refuse ``failed:<role>_<reason>``; rows are never
shifted onto each other.

A table with a caption column and no target column (none given, none of the auto names present)
and no partner columns is captions-only: each row is an item with no media, its caption and its
row number as id (``<source>/#row<n>``); an empty caption is ``failed:no_caption``. When the
caption column was detected, not given, and another column holds media file names, the table is
refused instead (a media column was forgotten).
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shardsmith.records import NO_CAPTION, TARGET, Item, MediaRef, SourceInfo
from shardsmith.sources import paths
from shardsmith.sources.base import SourceError, media_kind, resolve

MEDIA_COLUMNS = ("media", "file", "path", "image", "file_name", "filename", "video", "media_path")
CAPTION_COLUMNS = ("caption", "text", "prompt")


def _rows(path: Path) -> Iterator[dict[str, Any] | Exception]:
    """Yield each row as a dict (or the exception that made the row unreadable)."""
    fmt = path.suffix.lower().lstrip(".")
    try:
        if fmt == "csv":
            with path.open(newline="", encoding="utf-8-sig") as f:
                yield from _csv_rows(path, csv.reader(f))
        elif fmt == "jsonl":
            with path.open(encoding="utf-8-sig") as f:
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError as exc:
                        yield ValueError(f"line {n} is not valid JSON: {exc}")
                        continue
                    yield row if isinstance(row, dict) else ValueError(f"line {n} is not a JSON object")
        elif fmt == "json":
            data = json.loads(path.read_text(encoding="utf-8-sig"))
            if not isinstance(data, list):
                raise SourceError(f"table {path} must hold a JSON list of objects, got {type(data).__name__}")
            for n, row in enumerate(data):
                yield row if isinstance(row, dict) else ValueError(f"element {n} is not a JSON object")
        elif fmt == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            try:
                parquet = pq.ParquetFile(path)
            except (pa.ArrowException, ValueError) as exc:
                raise SourceError(f"table {path} is not a readable Parquet file ({exc}); re-export it, or use csv, "
                                  "json or jsonl") from None
            for batch in parquet.iter_batches(batch_size=1024):
                yield from batch.to_pylist()
        else:
            raise SourceError(f"table {path}: unknown format {fmt!r} (csv, json, jsonl, parquet)")
    except UnicodeDecodeError as exc:
        raise SourceError(f"table {path} is not UTF-8 ({exc}); re-save it as UTF-8") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise SourceError(f"table {path} cannot be read: {exc}") from None


def _csv_rows(path: Path, reader) -> Iterator[dict[str, Any] | Exception]:
    """A CSV table's rows as ``csv.DictReader`` gives them (blank lines skipped, a short row's missing
    cells None), except that nothing is dropped: a header that names a column twice is a
    :class:`SourceError` (its later column would hide the earlier one), and a row with more cells than
    the header (an unquoted comma in a caption, most often) is that row's error."""
    header = next(reader, None)
    if header is None:
        return
    dup = next((c for c in header if header.count(c) > 1), None)
    if dup is not None:
        raise SourceError(f"table {path}: the header names column {dup!r} {header.count(dup)} times "
                          f"(columns: {header}), and only one of them could be read; rename the others "
                          "(every column needs its own name)")
    for row in reader:
        if not row:
            continue
        if len(row) > len(header):
            extra = ", ".join(repr(c if len(c) <= 40 else c[:37] + "...") for c in row[len(header):])
            yield ValueError(f"line {reader.line_num} has {len(row)} cells and the header {len(header)} (extra: "
                             f"{extra}); quote a caption that contains commas, e.g. \"a cup, of coffee\"")
            continue
        yield dict(zip(header, row + [None] * (len(header) - len(row))))


def _detect(columns: list[str], wanted: str | None, options: tuple[str, ...], role: str, path: Path) -> str | None:
    if wanted is not None:
        if wanted not in columns:
            raise SourceError(f"table {path}: column {wanted!r} for {role} not found (columns: {columns}); "
                              f"fix columns.{role}")
        return wanted
    return next((c for c in options if c in columns), None)


_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?P<frac>\.[0-9]+)?(?P<exp>[eE][-+]?[0-9]+)?")


def _typed(v: Any) -> Any:
    """A CSV cell as the number it spells (``"3"`` -> 3, ``"0.25"`` -> 0.25, ``"1e-3"`` -> 0.001), so
    numbers stay numbers in the sample's json; anything else, and numbers a conversion would change
    (``"007"``, ``"+1"``, ``" 5"``, ``"1."``), stays the text it is."""
    if not isinstance(v, str):
        return v
    m = _NUMBER.fullmatch(v)
    if m is None:
        return v
    if m["frac"] is None and m["exp"] is None:
        return int(v)
    f = float(v)
    return f if math.isfinite(f) else v


def _plain(v: Any) -> Any:
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


class TableSource:
    def __init__(self, index: int, spec, exclude: list[Path]):
        self.path = Path(spec.path)
        self.root = self.path.parent.resolve()
        self.spec = spec
        first, problem = None, None
        for row in _rows(self.path):
            if isinstance(row, dict):
                first = row
                break
            problem = problem or row
        if first is None:  # every row is bad: say why rather than "no rows"
            raise SourceError(f"table {self.path} has no rows" if problem is None else
                              f"table {self.path} has no readable row: {problem}; fix the rows")
        cols = list(first.keys())
        given = spec.columns
        target_key = "target" if given.target is not None else "media"
        self.media_col = _detect(cols, given.target_column, MEDIA_COLUMNS, target_key, self.path)
        self.partner_cols = {role: _detect(cols, col, (), role, self.path) for role, col in given.partners().items()}
        self.caption_col = _detect(cols, given.caption, CAPTION_COLUMNS, "caption", self.path)
        if self.media_col is None:
            if self.partner_cols or self.caption_col is None:
                need = (f"columns.{', columns.'.join(self.partner_cols)} need a target" if self.partner_cols
                        else "and no caption column")
                raise SourceError(f"table {self.path}: no media column among {cols} ({need}); set "
                                  "columns.target (or columns.media), or columns.caption for a captions-only table")
            looks = [c for c, v in first.items() if c != self.caption_col and isinstance(v, str)
                     and media_kind(v.strip()) != "other"]
            if looks and given.caption is None:  # a forgotten media column, not a captions-only table
                raise SourceError(f"table {self.path}: no media column is set, but column {looks[0]!r} holds media "
                                  f"paths such as {str(first[looks[0]]).strip()!r}; set columns.target: {looks[0]}, "
                                  f"or columns.caption: {self.caption_col} to read the table as captions only")
        self.label_col = _detect(cols, spec.columns.label, ("label",), "label", self.path)
        self.labels: dict[Any, int] | None = None
        names: tuple[str, ...] | None = None
        if self.label_col is not None:
            values = {_plain(r.get(self.label_col)) for r in _rows(self.path) if isinstance(r, dict)}
            values.discard(None)
            values.discard("")
            if values and all(isinstance(v, int) or (isinstance(v, str) and v.strip().lstrip("-").isdigit())
                              for v in values):
                self.labels = {v: int(v) for v in values}
            else:
                ordered = sorted(str(v) for v in values)
                self.labels = {v: ordered.index(str(v)) for v in values}
                names = tuple(ordered)
        self.info = SourceInfo(index=index, name=spec.name, path=str(self.path), kind="table",
                               origin=spec.origin, license=spec.license, label_names=names)

    def _locate(self, rel: str, where: str) -> tuple[str, tuple[str, str] | None]:
        """``(resolved path, error)`` of a row's media path. Absolute and relative paths follow one
        rule: after symlinks are resolved the file must lie inside the table's folder unless the
        source sets ``allow_outside_paths``; a refused path is never opened."""
        root = str(self.root)
        real, problem = resolve(paths.table_target(rel, root))
        if not paths.within(real, root) and not self.spec.allow_outside_paths:
            return real, ("path_outside_table_dir",
                          f"{where} names {rel!r}, which resolves outside {root}; move the file into the "
                          "table's folder or set allow_outside_paths: true on this source")
        if problem == "symlink_loop":
            return real, ("symlink_loop", f"{where} names {rel!r}, which is a symbolic link loop; fix the link "
                          "or delete the row")
        if problem == "missing":
            return real, ("missing_file", f"{where} names {rel!r}, but {real} does not exist; fix the path "
                          "(relative to the table's folder) or delete the row")
        if problem is None and not os.path.isfile(real):  # a folder, a pipe, a device: never opened
            folder = os.path.isdir(real)
            what = "a folder" if folder else paths.special_file(real)
            fix = ("name a media file inside it" if folder else
                   "opening it could wait forever or read without end; name a regular media file")
            return real, (paths.NOT_REGULAR, f"{where} names {rel!r}, but {real} is "
                          f"{what + ', not' if what else 'not'} a regular file; {fix}, or delete the row")
        return real, None  # an unreadable file fails when the probe reads it

    def _partners(self, row: dict[str, Any], where: str) -> tuple[dict[str, MediaRef], tuple[str, str] | None]:
        """The row's partner files by role and the first problem among them: an empty cell or a
        file that is not there is ``missing_<role>``; a path the rules refuse is ``<role>_<reason>``."""
        media: dict[str, MediaRef] = {}
        for role, col in self.partner_cols.items():
            raw = _plain(row.get(col))
            rel = str(raw).strip() if raw is not None else ""
            if not rel:
                return media, (f"missing_{role}", f"{where} has an empty {col!r} (its {role}); fill it in or "
                               "delete the row")
            path, error = self._locate(rel, f"{where}, column {col!r} ({role}),")
            if error is not None:
                reason = f"missing_{role}" if error[0] == "missing_file" else f"{role}_{error[0]}"
                return media, (reason, error[1])
            media[role] = MediaRef(path, rel.replace("\\", "/"))
        return media, None

    def count(self) -> int:
        """How many items :meth:`items` yields (one per row): a Parquet file's row count from its
        footer, else the rows parsed without resolving any path."""
        if self.path.suffix.lower() == ".parquet":
            import pyarrow.parquet as pq

            return pq.ParquetFile(self.path).metadata.num_rows
        return sum(1 for _ in _rows(self.path))

    def items(self) -> Iterator[Item]:
        seen: set[str] = set()
        role_cols = {c for c in self.partner_cols.values()}
        typed = _typed if self.path.suffix.lower() == ".csv" else (lambda v: v)  # CSV cells are all text
        for n, row in enumerate(_rows(self.path)):
            where = f"row {n} of {self.path.name}"
            if isinstance(row, Exception):
                yield Item(item_id=f"{self.spec.name}/#row{n}", source=self.info.index, path="", relpath="",
                           error=("bad_row", f"{where}: {row}; fix or delete that row"))
                continue
            raw = _plain(row.get(self.media_col)) if self.media_col else None
            rel = str(raw).strip() if raw is not None else ""
            item_id = f"{self.spec.name}/{rel}" if rel and rel not in seen else f"{self.spec.name}/{rel}#row{n}"
            seen.add(rel)
            caption = _plain(row.get(self.caption_col)) if self.caption_col else None
            label_raw = _plain(row.get(self.label_col)) if self.label_col else None
            label = self.labels.get(label_raw) if self.labels is not None and label_raw not in (None, "") else None
            label_name = str(label_raw) if label is not None else None
            meta = {k: typed(_plain(v)) for k, v in row.items()
                    if k not in (self.media_col, self.caption_col, self.label_col) and k not in role_cols}
            meta = json.loads(json.dumps(meta, default=str))
            error = None
            path = ""
            partners: dict[str, MediaRef] = {}
            if self.media_col is None:  # a captions-only table: the caption is the item
                if caption is None or not str(caption).strip():
                    error = (NO_CAPTION, f"{where} has an empty {self.caption_col!r}, and this table has no "
                             "media column; fill the caption in or delete the row")
            elif not rel:
                error = ("no_media_path", f"{where} has an empty {self.media_col!r}; fill it in or delete the row")
            else:
                path, error = self._locate(rel, where)
                partners, partner_error = self._partners(row, where)
                error = error or partner_error
            media = {TARGET: MediaRef(path, rel.replace("\\", "/"))} if path else {}
            yield Item(item_id=item_id, source=self.info.index, path=path, relpath=rel.replace("\\", "/"),
                       caption=None if caption is None else str(caption), label=label, label_name=label_name,
                       meta=meta, error=error, media={**media, **partners})
