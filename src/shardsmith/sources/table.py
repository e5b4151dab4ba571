"""Metadata table source: CSV, JSON (list of objects), JSONL or Parquet.

Column roles come from ``columns:`` (or are detected: media/file/path/image/file_name for the
target, caption/text/prompt, label). Partner roles (``source``, ``reference``, ``mask``,
``audio``, ``camera``) are only taken from ``columns:``; each row's partner files land in
``Item.media`` by role. Other columns are kept as per-sample metadata. Every media path (target
and partners) resolves against the table's own folder; a path that lands outside that folder
once symlinks are resolved (``..``, an absolute path, a link) is refused per row, unopened,
unless ``allow_outside_paths: true``. A missing file's message says when the cell is a URL (nothing is
downloaded) or when its folder holds the name spelled in another Unicode normalisation (NFC / NFD). A bad row (missing file, no media path, unparsable line,
a CSV row with more cells than the header: ``bad_row``) becomes that row's ``failed:<reason>``; a
path that names a folder, a named pipe or a device is ``failed:not_a_regular_file``, never opened; a
CSV header that names a column twice is refused (:class:`SourceError`); a CSV metadata cell that
spells a number is kept as that number; a partner that is missing or empty is
``failed:missing_<role>``, one the path rules refuse ``failed:<role>_<reason>``; rows are never
shifted onto each other.

A media path (target and partners) is named by its one spelling (:func:`paths.table_name`), the name a
folder source at the table's folder gives the file: ``a//b.mp4``, ``./a/b.mp4``, ``a/../a/b.mp4`` and the
absolute path of the table's ``a/b.mp4`` are all ``a/b.mp4`` (item ``<source>/a/b.mp4``, key ``a_b``); the
file is read where the path as written resolves (a ``..`` after a symbolic link keeps its place in the
name). A row naming a file an earlier row named, in any spelling, is the item ``<source>/<name>#row<n>``
exactly as a repeated row is: the plan skips it as ``skipped:duplicate`` (the same bytes), or, with
``split.dedup: false``, writes it under its own key.

A CSV that does not parse is refused (:class:`SourceError`, naming the line and the fix) before
anything is planned, never read as fewer rows: a quote (``"``) that is never closed, a cell over
:data:`CSV_FIELD_LIMIT` characters (what a stray quote makes of the lines after it), a media path
(target or partner) or a header cell that runs over several lines (a stray quote closed rows
later); a long quoted caption, even over several lines, is a caption. A JSON / JSONL value with an
unpaired surrogate escape (``"\\udce9"``: no character, and UTF-8 cannot hold it) is that row's
``failed:bad_row``. A media path that resolves to a name that is not valid UTF-8 (a link to a
Latin-1 ``caf\\xe9.jpg``) is ``failed:name_not_utf8``, unopened; a table whose own folder's path is
not UTF-8 is refused.

A label column of whole numbers gives the class ids as written; a whole number written as a float (``1.0``,
``"1.0"`` in a CSV, a Parquet / pandas float column of whole numbers, where an empty cell made the column
float) is that whole number. Labels none of which is a whole number are names, numbered 0..K-1 in sorted order.
A negative whole-number label (``-1``, ``"-1"``, ``-1.0``) or a true/false one refuses the table
(:class:`SourceError`, naming the row and the fix): EDM / FastGen would train ``-1`` as the last class and ``true``
as class 1. So does a column mixing whole numbers with names (``2``, ``10``, ``"x"``): numbered as names, ``10``
would be class 0 and ``2`` class 1. An empty label cell is an item with no label.

A table with a caption column and no target column (none given, none of the auto names present)
and no partner columns is captions-only: each row is an item with no media, its caption and its
row number as id (``<source>/#row<n>``); an empty caption is ``failed:no_caption``. When the
caption column was detected, not given, and another column holds media file names, the table is
refused instead (a media column was forgotten).
"""

from __future__ import annotations

import csv
import decimal
import json
import math
import os
import re
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shardsmith.atomic import loads_json
from shardsmith.records import NO_CAPTION, TARGET, Item, MediaRef, SourceInfo
from shardsmith.sources import paths
from shardsmith.sources.base import SourceError, media_kind, resolve, shown, utf8_ok

MEDIA_COLUMNS = ("media", "file", "path", "image", "file_name", "filename", "video", "media_path")
CAPTION_COLUMNS = ("caption", "text", "prompt")

#: the largest CSV cell read, in characters: Python's default (128 KiB) refuses long captions; a larger cell is
#: refused with its line number (what an unclosed quote makes of the rest of a large table), so memory stays bounded
CSV_FIELD_LIMIT = 16 << 20
csv.field_size_limit(max(csv.field_size_limit(), CSV_FIELD_LIMIT))


def _unpaired(row: dict[str, Any]) -> str | None:
    """Where a parsed JSON row holds text UTF-8 cannot hold (an unpaired ``\\udXXX`` escape): ``"the value of
    column 'c'"`` (at any depth in it), ``"the column name '...'"``, or None when every key and string is valid."""
    def bad(v: Any) -> bool:
        if isinstance(v, str):
            return not utf8_ok(v)
        if isinstance(v, dict):
            return any(bad(k) or bad(x) for k, x in v.items())
        if isinstance(v, list):
            return any(bad(x) for x in v)
        return False

    for k, v in row.items():
        if not utf8_ok(k):
            return f"the column name '{shown(k)}'"
        if bad(v):
            return f"the value of column '{k}'"
    return None


#: the deepest nesting of arrays / objects a JSON row may hold: a deeper value (which no caption table needs) would
#: break the pickling and JSON writing of the item's metadata later on, so its row is refused with this number
MAX_ROW_DEPTH = 100


def _too_deep(row: dict[str, Any]) -> str | None:
    """The column whose value nests arrays / objects more than :data:`MAX_ROW_DEPTH` levels deep, or None
    (walked without recursion: the value may be nested nearly as deep as the parser follows)."""
    for k, v in row.items():
        stack = [(v, 1)]
        while stack:
            x, depth = stack.pop()
            if isinstance(x, (dict, list)):
                if depth > MAX_ROW_DEPTH:
                    return k
                stack.extend((y, depth + 1) for y in (x.values() if isinstance(x, dict) else x))
    return None


def _may_nest_too_deep(text: str) -> bool:
    """Whether JSON ``text`` has brackets enough to nest past :data:`MAX_ROW_DEPTH` (most rows have not: no walk)."""
    return text.count("[") + text.count("{") > MAX_ROW_DEPTH


def _row_error(where: str, row: dict[str, Any], line: str, deep: bool = True) -> ValueError | None:
    """What makes the parsed JSON row ``row`` (of text ``line``) unusable, or None; ``deep``: whether its text
    may nest too deep (:func:`_may_nest_too_deep`), else the walk is skipped."""
    if deep and (col := _too_deep(row)) is not None:
        return ValueError(f"{where}: the value of column '{shown(str(col))}' nests arrays or objects more than "
                          f"{MAX_ROW_DEPTH} levels deep; flatten it (or drop that column)")
    what = _unpaired(row) if "\\ud" in line.lower() else None
    return None if what is None else _surrogate_error(where, what)


def _surrogate_error(where: str, what: str) -> ValueError:
    return ValueError(f"{where}: {what} holds an unpaired surrogate escape (\\udXXX with no partner), which is no "
                      "character and cannot be written as UTF-8; fix the escape (a character beyond U+FFFF is a pair "
                      "such as \\ud83d\\ude00) or write the character itself")


class _Lines:
    """A text file's lines for ``csv.reader`` (:attr:`lines`), noting (:attr:`eof`) when the reader has asked past
    the last one: a row the reader then returns ended at the end of the file inside a quoted cell (an unclosed
    quote)."""

    def __init__(self, f):
        self.eof = False
        self.lines = self._read(f)

    def _read(self, f) -> Iterator[str]:
        yield from f
        self.eof = True


def _rows(path: Path, path_cols: frozenset[str] = frozenset()) -> Iterator[dict[str, Any] | Exception]:
    """Yield each row as a dict (or the exception that made the row unreadable). ``path_cols``: the CSV
    columns that hold media paths (a cell there that runs over several lines refuses the table)."""
    fmt = path.suffix.lower().lstrip(".")
    try:
        if fmt == "csv":
            with path.open(newline="", encoding="utf-8-sig") as f:
                yield from _csv_rows(path, f, path_cols)
        elif fmt == "jsonl":
            with path.open(encoding="utf-8-sig") as f:
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        row = loads_json(line)
                    except json.JSONDecodeError as exc:
                        yield ValueError(f"line {n} is not valid JSON: {exc}")
                        continue
                    if not isinstance(row, dict):
                        yield ValueError(f"line {n} is not a JSON object")
                        continue
                    err = _row_error(f"line {n}", row, line, _may_nest_too_deep(line))
                    yield row if err is None else err
        elif fmt == "json":
            text = path.read_text(encoding="utf-8-sig")
            data = loads_json(text)
            if not isinstance(data, list):
                raise SourceError(f"table {path} must hold a JSON list of objects, got {type(data).__name__}")
            escapes = "\\ud" if "\\ud" in text.lower() else ""
            deep = _may_nest_too_deep(text)
            for n, row in enumerate(data):
                if not isinstance(row, dict):
                    yield ValueError(f"element {n} is not a JSON object")
                    continue
                err = _row_error(f"element {n}", row, escapes, deep)
                yield row if err is None else err
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
    except json.JSONDecodeError as exc:
        raise SourceError(f"table {path} is not valid JSON ({exc}); fix it, or re-export it as a JSON list of "
                          "objects or as JSONL (one object a line)") from None
    except OSError as exc:
        raise SourceError(f"table {path} cannot be read: {exc}") from None


def _csv_rows(path: Path, f, path_cols: frozenset[str] = frozenset()) -> Iterator[dict[str, Any] | Exception]:
    """A CSV table's rows as ``csv.DictReader`` gives them (blank lines skipped, a short row's missing
    cells None), except that nothing is dropped: a header that names a column twice is a
    :class:`SourceError` (its later column would hide the earlier one), and a row with more cells than
    the header (an unquoted comma in a caption, most often) is that row's error.

    A table that does not parse is a :class:`SourceError` naming the line, never fewer rows: a record the file
    ends inside (a quote that is never closed), a cell over :data:`CSV_FIELD_LIMIT`, any other parse error, and a
    record over several lines (a quoted cell with line breaks) that has more cells than the header or a line
    break in a media path (a ``path_cols`` cell) or in the header: a stray quote closed rows later."""
    lines = _Lines(f)
    reader = csv.reader(lines.lines)
    header: list[str] | None = None
    checked: list[tuple[int, str]] = []
    while True:
        start = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise SourceError(_csv_error(path, start, reader.line_num, exc)) from None
        end = reader.line_num
        if end > start or lines.eof:  # a quoted cell over several lines, or one the file ends inside
            _multi_line(path, row, start, end, lines.eof, header, checked)
        if header is None:
            header = row
            dup = next((c for c in header if header.count(c) > 1), None)
            if dup is not None:
                raise SourceError(f"table {path}: the header names column {dup!r} {header.count(dup)} times "
                                  f"(columns: {header}), and only one of them could be read; rename the others "
                                  "(every column needs its own name)")
            checked = [(i, c) for i, c in enumerate(header) if c in path_cols]
            continue
        if not row:
            continue
        if len(row) > len(header):
            extra = ", ".join(repr(c if len(c) <= 40 else c[:37] + "...") for c in row[len(header):])
            yield ValueError(f"line {start} has {len(row)} cells and the header {len(header)} (extra: "
                             f"{extra}); quote a caption that contains commas, e.g. \"a cup, of coffee\"")
            continue
        yield dict(zip(header, row + [None] * (len(header) - len(row))))


_QUOTE_FIX = "close the quote, or remove it (a quote that is part of a quoted cell's text is written twice: \"\")"


def _csv_error(path: Path, start: int, line: int, exc: csv.Error) -> str:
    """The message for a CSV parse error met on ``line`` in the record that starts on line ``start``."""
    if "field limit" in str(exc):
        return (f"table {path}: the row that starts on line {start} has a cell over {CSV_FIELD_LIMIT >> 20} MiB by "
                f"line {line}: most likely a quote (\") opened on line {start} is never closed, so the lines after it "
                f"run into that cell; {_QUOTE_FIX}")
    return f"table {path}: line {line} is not valid CSV ({exc}); fix that line"


def _multi_line(path: Path, row: list[str], start: int, end: int, eof: bool, header: list[str] | None,
                checked: list[tuple[int, str]]) -> None:
    """Refuse (:class:`SourceError`) a CSV record over lines ``start``-``end`` that a stray quote made: one the
    file ends inside (``eof``), the header, one with more cells than the header, one with a line break in a
    media path (``checked``: the path columns by position). A quoted caption over several lines passes."""
    if eof:  # the reader read past the last line for this record: it ends inside a quoted cell
        raise SourceError(f"table {path}: the row that starts on line {start} opens a quote (\") that is never "
                          f"closed, so lines {start}-{end} (the end of the file) would be read as one row; "
                          f"{_QUOTE_FIX}")
    closed = (f"a quote (\") opened on line {start} is closed only on line {end}, and the lines between were read as "
              "one cell; remove the stray quote (a quote that is part of a quoted cell's text is written twice: "
              "\"\"), then build again")
    if header is None:
        raise SourceError(f"table {path}: the header runs over lines {start}-{end}: {closed}")
    if len(row) > len(header):
        raise SourceError(f"table {path}: the row that starts on line {start} runs over lines {start}-{end} and has "
                          f"{len(row)} cells, the header {len(header)}: {closed}")
    for i, col in checked:
        if i < len(row) and ("\n" in row[i] or "\r" in row[i]):
            raise SourceError(f"table {path}: the {col!r} cell (a media path) of the row that starts on line {start} "
                              f"runs over lines {start}-{end}: {closed}")


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


_WHOLE_TEXT = re.compile(r"\s*(-?\d+)(?:\.0*)?\s*")  # "3", " 3 ", "-1", "1.0", "1.": a CSV cell of a whole number


def _whole(v: Any) -> int | None:
    """The label ``v`` as the whole number it is, else None: ``3``, ``3.0`` (a float column: Parquet, pandas,
    JSON ``3.0``), the text ``"3"`` or ``"3.0"`` (a CSV cell); never a true/false value."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return int(v) if math.isfinite(v) and v.is_integer() else None
    if isinstance(v, decimal.Decimal):  # a Parquet decimal column
        return int(v) if v.is_finite() and v == v.to_integral_value() else None
    if isinstance(v, str):
        m = _WHOLE_TEXT.fullmatch(v)
        return int(m[1]) if m is not None else None
    return None


def _negative_whole(v: Any) -> bool:
    """Whether the label ``v`` is a negative whole number: ``-1``, ``-1.0``, or the text ``"-1"`` / ``"-1.0"``
    (a CSV cell)."""
    w = _whole(v)
    return w is not None and w < 0


def _label_error(path: Path, col: str, bad: list[tuple[int, Any]]) -> str:
    """The message refusing the table at ``path`` for the label cells ``bad`` (``(row, value)``, in order)."""
    n, v = bad[0]
    rows = [str(r) for r, _ in bad[1:6]] + (["..."] if len(bad) > 6 else [])
    more = f" (row{'s' if len(rows) > 1 else ''} {', '.join(rows)} too: negative or true/false)" if rows else ""
    shown_v = json.dumps(v) if isinstance(v, bool) else repr(v)
    if isinstance(v, bool):
        why = ("a true/false value, not a class: EDM / FastGen class ids are whole numbers from 0, and "
               f"{shown_v} would be taken as class {int(v)}, merged with that class's images")
        fix = ("write the class id (0 or 1) or a quoted name (\"yes\" / \"no\": names are numbered 0..K-1 in "
               "sorted order)")
    else:
        why = ("a negative class id: EDM / FastGen class ids run from 0 to K-1 and one-hot encode a label as "
               "np.eye(K)[label], so -1 would silently train as the last class")
        fix = "renumber the labels from 0, or write them as names (numbered 0..K-1 in sorted order)"
    return (f"table {path}: row {n} of {path.name} has label {shown_v} in column {col!r}{more}, {why}; {fix}, "
            "or leave the cell empty for an item with no label (class-conditional outputs skip it)")


#: a cell that is a URL (``https://...``, ``s3://...``): not a local path
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def _form(name: str) -> str:
    """Which Unicode normalisation ``name`` is in: ``NFC``, ``NFD``, or ``mixed`` (neither)."""
    return next((f for f in ("NFC", "NFD") if unicodedata.is_normalized(f, name)), "mixed")


class _Twins:
    """Finds, for a path that does not exist, a name in its folder that differs from it only in Unicode
    normalisation. A few folders' listings are kept (a table names many files of one folder), so a table whose
    every name is spelled otherwise costs one listing per folder, not one per row."""

    KEPT = 4

    def __init__(self) -> None:
        self.listings: dict[str, dict[str, list[str]]] = {}

    def _listing(self, folder: str) -> dict[str, list[str]]:
        if folder not in self.listings:
            if len(self.listings) >= self.KEPT:
                self.listings.pop(next(iter(self.listings)))
            by_form: dict[str, list[str]] = {}
            try:
                with os.scandir(folder) as entries:
                    for e in entries:
                        if not e.name.isascii():  # an ASCII name has one spelling in every normalisation
                            by_form.setdefault(unicodedata.normalize("NFC", e.name), []).append(e.name)
            except OSError:
                pass
            self.listings[folder] = by_form
        return self.listings[folder]

    def spelled_otherwise(self, real: str) -> tuple[str, str, str] | None:
        """``(folder, missing name, the name in folder spelled otherwise)`` for the first component of the
        missing path ``real`` that does not exist, or None when its folder holds no such twin."""
        p, parts = real, []
        while not os.path.lexists(p) and os.path.dirname(p) != p:
            p, part = os.path.split(p)
            parts.append(part)
        if not parts or parts[-1].isascii() or not utf8_ok(parts[-1]):
            return None
        wanted = parts[-1]
        found = [n for n in self._listing(p).get(unicodedata.normalize("NFC", wanted), []) if n != wanted]
        return (p, wanted, found[0]) if found else None


class TableSource:
    def __init__(self, index: int, spec, exclude: list[Path]):
        self.path = Path(spec.path)
        self.root = self.path.parent.resolve()
        #: the table's folder with links resolved and as written: a media path under either is named relative to it
        self.dirs = tuple(dict.fromkeys((str(self.root), os.path.abspath(self.path.parent))))
        self.spec = spec
        self._twins = _Twins()
        for what, where in (("path", str(self.path)), ("folder", str(self.root))):
            if not utf8_ok(where):
                raise SourceError(f"source '{shown(spec.name)}': the table's {what} {shown(where)} is not valid UTF-8 "
                                  "(\\xNN marks each byte that is not), and the manifest and ledger cannot hold it; "
                                  "rename it to UTF-8")
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
        self.path_cols = frozenset(c for c in (self.media_col, *self.partner_cols.values()) if c is not None)
        self.labels: dict[Any, int] | None = None
        names: tuple[str, ...] | None = None
        if self.label_col is None and self.path.suffix.lower() == ".csv":
            for _ in _rows(self.path, self.path_cols):  # a CSV that does not parse is refused now, not mid-plan
                pass
        if self.label_col is not None:
            values = self._label_values()
            if values and all(_whole(v) is not None for v in values):  # _label_values refused a mix
                self.labels = {v: _whole(v) for v in values}
            else:
                ordered = sorted(str(v) for v in values)
                self.labels = {v: ordered.index(str(v)) for v in values}
                names = tuple(ordered)
        self.info = SourceInfo(index=index, name=spec.name, path=str(self.path), kind="table",
                               origin=spec.origin, license=spec.license, label_names=names)

    def _label_values(self) -> set[Any]:
        """The label column's distinct values (empty cells left out), each row checked first: a negative
        whole number (``-1``, ``"-1"``) or a true/false value refuses the table (:class:`SourceError`, naming
        the first such row and the fix), as EDM / FastGen would read either as another class without a word:
        ``-1`` one-hot encodes as the last class, and ``true`` is ``1`` (it would merge with class 1). So does a
        column of whole numbers and names both: numbering them all as names would renumber the whole ones."""
        values: set[Any] = set()
        bad: list[tuple[int, Any]] = []
        first_whole: tuple[int, Any] | None = None
        first_name: tuple[int, Any] | None = None
        for n, row in enumerate(_rows(self.path, self.path_cols)):
            if not isinstance(row, dict):
                continue
            v = _plain(row.get(self.label_col))
            if v is None or v == "":
                continue
            if isinstance(v, bool) or _negative_whole(v):
                bad.append((n, v))
            elif not bad:
                values.add(v)
                if _whole(v) is not None:
                    first_whole = first_whole or (n, v)
                else:
                    first_name = first_name or (n, v)
        if bad:
            raise SourceError(_label_error(self.path, self.label_col, bad))
        if first_whole is not None and first_name is not None:
            (wn, wv), (nn, nv) = first_whole, first_name
            raise SourceError(
                f"table {self.path}: column {self.label_col!r} mixes class ids and names: row {wn} of {self.path.name} "
                f"has the whole number {wv!r} and row {nn} the name {nv!r}; numbered as names (0..K-1 in sorted "
                "text order) the whole numbers would silently become other class ids; write every label as a class "
                "id (whole numbers from 0) or every one as a name (a name needs a character that is not a digit, "
                "e.g. 'c2'), or leave the cell empty for an item with no label")
        return values

    def _name(self, rel: str, real: str) -> str:
        """The one spelling of the row's media path ``rel`` (:func:`paths.table_name`), which resolves to
        ``real``; where a symbolic link before a ``..`` makes that name another file, only repeated slashes and
        ``.`` are dropped (:func:`paths.clean` without ``parents``)."""
        name = paths.table_name(rel, self.dirs)
        if name != rel and resolve(paths.table_target(name, str(self.root)))[0] != real:
            return paths.clean(rel, parents=False)
        return name

    def _locate(self, rel: str, where: str) -> tuple[str, str, tuple[str, str] | None]:
        """``(name, resolved path, error)`` of a row's media path ``rel`` as written; ``name`` is its one
        spelling (:meth:`_name`: ``a//b.mp4``, ``./a/b.mp4``, ``a/../a/b.mp4`` and the absolute path of the
        table's ``a/b.mp4`` are all ``a/b.mp4``). Absolute and relative paths follow one rule: after
        symlinks are resolved the file must lie inside the table's folder unless the source sets
        ``allow_outside_paths``; a refused path is never opened."""
        root = str(self.root)
        real, problem = resolve(paths.table_target(rel, root))
        name = self._name(rel, real)
        if not paths.within(real, root) and not self.spec.allow_outside_paths:
            return name, shown(real), ("path_outside_table_dir",
                                       f"{where} names {rel!r}, which resolves outside {root}; move the file "
                                       "into the table's folder or set allow_outside_paths: true on this source")
        if not utf8_ok(real):  # a link to a file whose name is not UTF-8: no output could hold it
            return name, shown(real), (paths.NAME_NOT_UTF8, f"{where} names {rel!r}, which resolves to "
                                       f"{shown(real)}, a name that is not valid UTF-8 (\\xNN marks each byte "
                                       "that is not) and that no dataset format, manifest or ledger can hold; "
                                       "rename that file to UTF-8")
        if problem == "symlink_loop":
            return name, real, ("symlink_loop", f"{where} names {rel!r}, which is a symbolic link loop; fix the "
                                "link or delete the row")
        if problem == "missing":
            return name, real, ("missing_file", self._missing(rel, real, where))
        if problem is None and not os.path.isfile(real):  # a folder, a pipe, a device: never opened
            folder = os.path.isdir(real)
            what = "a folder" if folder else paths.special_file(real)
            fix = ("name a media file inside it" if folder else
                   "opening it could wait forever or read without end; name a regular media file")
            return name, real, (paths.NOT_REGULAR, f"{where} names {rel!r}, but {real} is "
                                f"{what + ', not' if what else 'not'} a regular file; {fix}, or delete the row")
        return name, real, None  # an unreadable file fails when the probe reads it

    def _missing(self, rel: str, real: str, where: str) -> str:
        """The message for a row's media path ``rel`` whose file ``real`` does not exist: a URL is said to be
        one (nothing is downloaded); a name that a file in its folder spells in another Unicode normalisation
        (the table's NFC ``café.jpg``, the file's NFD ``cafe\u0301.jpg``, as macOS writes names) is named."""
        if _URL.match(rel):
            return (f"{where} names {rel!r}, a URL: shardsmith reads local files and downloads nothing; fetch the "
                    "files first (e.g. with img2dataset), then put their local paths (relative to the table's "
                    "folder) in this column, or delete the row")
        twin = self._twins.spelled_otherwise(real)
        if twin is not None:
            folder, wanted, found = twin
            return (f"{where} names {rel!r}, but {real} does not exist: {folder} holds {found!r}, which looks the "
                    f"same but is spelled in another Unicode normalisation: {ascii(found)} is {_form(found)}, the "
                    f"table's {ascii(wanted)} {_form(wanted)}, different bytes to the file system; rename the file or "
                    "rewrite the cell so both are spelled alike (unicodedata.normalize('NFC', name) makes them "
                    "equal), or delete the row")
        return (f"{where} names {rel!r}, but {real} does not exist; fix the path (relative to the table's folder) "
                "or delete the row")

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
            name, path, error = self._locate(rel, f"{where}, column {col!r} ({role}),")
            if error is not None:
                reason = f"missing_{role}" if error[0] == "missing_file" else f"{role}_{error[0]}"
                return media, (reason, error[1])
            media[role] = MediaRef(path, name.replace("\\", "/"))
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
        for n, row in enumerate(_rows(self.path, self.path_cols)):
            where = f"row {n} of {self.path.name}"
            if isinstance(row, Exception):
                yield Item(item_id=f"{self.spec.name}/#row{n}", source=self.info.index, path="", relpath="",
                           error=("bad_row", f"{where}: {row}; fix or delete that row"))
                continue
            raw = _plain(row.get(self.media_col)) if self.media_col else None
            rel = str(raw).strip() if raw is not None else ""
            name, path, error = self._locate(rel, where) if self.media_col is not None and rel else ("", "", None)
            # a file named again (in any spelling: the same name) is a row of its own, as a repeated row is
            item_id = f"{self.spec.name}/{name}" if name and name not in seen else f"{self.spec.name}/{name}#row{n}"
            seen.add(name)
            caption = _plain(row.get(self.caption_col)) if self.caption_col else None
            label_raw = _plain(row.get(self.label_col)) if self.label_col else None
            label = self.labels.get(label_raw) if self.labels is not None and label_raw not in (None, "") else None
            label_name = (str(label) if self.info.label_names is None else str(label_raw)) if label is not None else None
            meta = {k: typed(_plain(v)) for k, v in row.items()
                    if k not in (self.media_col, self.caption_col, self.label_col) and k not in role_cols}
            meta = json.loads(json.dumps(meta, default=str))
            partners: dict[str, MediaRef] = {}
            if self.media_col is None:  # a captions-only table: the caption is the item
                if caption is None or not str(caption).strip():
                    error = (NO_CAPTION, f"{where} has an empty {self.caption_col!r}, and this table has no "
                             "media column; fill the caption in or delete the row")
            elif not rel:
                error = ("no_media_path", f"{where} has an empty {self.media_col!r}; fill it in or delete the row")
            else:
                partners, partner_error = self._partners(row, where)
                error = error or partner_error
            relpath = name.replace("\\", "/")
            media = {TARGET: MediaRef(path, relpath)} if path else {}
            yield Item(item_id=item_id, source=self.info.index, path=path, relpath=relpath,
                       caption=None if caption is None else str(caption), label=label, label_name=label_name,
                       meta=meta, error=error, media={**media, **partners})
