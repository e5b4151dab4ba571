"""Metadata table source: CSV, JSON (list of objects), JSONL or Parquet.

Column roles come from ``columns:`` (or are detected: media/file/path/image/file_name,
caption/text/prompt, label). Other columns are kept as per-sample metadata. Media paths
resolve against the table's own folder; a path that lands outside that folder once symlinks are
resolved (``..``, an absolute path, a link) is refused per row, unopened, unless
``allow_outside_paths: true``. A bad row (missing file, no media path, unparsable
line) becomes that row's ``failed:<reason>``; rows are never shifted onto each other.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shardsmith.records import Item, SourceInfo
from shardsmith.sources import paths
from shardsmith.sources.base import SourceError, resolve

MEDIA_COLUMNS = ("media", "file", "path", "image", "file_name", "filename", "video", "media_path")
CAPTION_COLUMNS = ("caption", "text", "prompt")


def _rows(path: Path) -> Iterator[dict[str, Any] | Exception]:
    """Yield each row as a dict (or the exception that made the row unreadable)."""
    fmt = path.suffix.lower().lstrip(".")
    try:
        if fmt == "csv":
            with path.open(newline="", encoding="utf-8-sig") as f:
                yield from csv.DictReader(f)
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
            import pyarrow.parquet as pq

            for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
                yield from batch.to_pylist()
        else:
            raise SourceError(f"table {path}: unknown format {fmt!r} (csv, json, jsonl, parquet)")
    except UnicodeDecodeError as exc:
        raise SourceError(f"table {path} is not UTF-8 ({exc}); re-save it as UTF-8") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise SourceError(f"table {path} cannot be read: {exc}") from None


def _detect(columns: list[str], wanted: str | None, options: tuple[str, ...], role: str, path: Path) -> str | None:
    if wanted is not None:
        if wanted not in columns:
            raise SourceError(f"table {path}: column {wanted!r} for {role} not found (columns: {columns}); "
                              f"fix columns.{role}")
        return wanted
    return next((c for c in options if c in columns), None)


def _plain(v: Any) -> Any:
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


class TableSource:
    def __init__(self, index: int, spec, exclude: list[Path]):
        self.path = Path(spec.path)
        self.root = self.path.parent.resolve()
        self.spec = spec
        first = next((r for r in _rows(self.path) if isinstance(r, dict)), None)
        if first is None:
            raise SourceError(f"table {self.path} has no rows")
        cols = list(first.keys())
        self.media_col = _detect(cols, spec.columns.media, MEDIA_COLUMNS, "media", self.path)
        if self.media_col is None:
            raise SourceError(f"table {self.path}: no media column among {cols}; set columns.media")
        self.caption_col = _detect(cols, spec.columns.caption, CAPTION_COLUMNS, "caption", self.path)
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
        if problem == "missing" or (problem is None and not os.path.isfile(real)):
            return real, ("missing_file", f"{where} names {rel!r}, but {real} does not exist; fix the path "
                          "(relative to the table's folder) or delete the row")
        return real, None  # an unreadable file fails when the probe reads it

    def items(self) -> Iterator[Item]:
        seen: set[str] = set()
        for n, row in enumerate(_rows(self.path)):
            where = f"row {n} of {self.path.name}"
            if isinstance(row, Exception):
                yield Item(item_id=f"{self.spec.name}/#row{n}", source=self.info.index, path="", relpath="",
                           error=("bad_row", f"{where}: {row}; fix or delete that row"))
                continue
            raw = _plain(row.get(self.media_col))
            rel = str(raw).strip() if raw is not None else ""
            item_id = f"{self.spec.name}/{rel}" if rel and rel not in seen else f"{self.spec.name}/{rel}#row{n}"
            seen.add(rel)
            caption = _plain(row.get(self.caption_col)) if self.caption_col else None
            label_raw = _plain(row.get(self.label_col)) if self.label_col else None
            label = self.labels.get(label_raw) if self.labels is not None and label_raw not in (None, "") else None
            label_name = str(label_raw) if label is not None else None
            meta = {k: _plain(v) for k, v in row.items() if k not in (self.media_col, self.caption_col, self.label_col)}
            meta = json.loads(json.dumps(meta, default=str))
            error = None
            path = ""
            if not rel:
                error = ("no_media_path", f"{where} has an empty {self.media_col!r}; fill it in or delete the row")
            else:
                path, error = self._locate(rel, where)
            yield Item(item_id=item_id, source=self.info.index, path=path, relpath=rel.replace("\\", "/"),
                       caption=None if caption is None else str(caption), label=label, label_name=label_name,
                       meta=meta, error=error)
