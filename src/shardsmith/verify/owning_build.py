"""Which shardsmith build wrote a dataset, whether that build is finished, and the count its
manifest records.

- :func:`find_build`: the :class:`BuildRef` of the nearest build folder at or above a dataset
  (``formats.detect.enclosing_build``) whose recorded recipe (or manifest) has an output at the
  dataset, else None.
- :func:`unfinished`: the message ``verify`` fails with for a build that is not finished, or None.
- :func:`unfinished_build`: the :class:`UnfinishedBuild` a path is, or lies inside, when that build is not
  finished (any path: the build folder, an output not written yet), or None; ``register`` and ``repair``
  refuse it (``verify.repair.refuse_unfinished_build``). It and :func:`unfinished` share one reading of
  the ledger (:func:`_not_finished_why`) and of the lock (:func:`running_on`).
- :func:`manifest_count`: the ``written`` count the enclosing build's manifest records for the
  dataset, and where it was read, or ``(None, None)``.
- A bucket folder of a multi-bucket output (``lat/64x64x17`` beside ``lat/buckets.json``) is that output's:
  :func:`find_build` gives its :class:`BuildRef` with ``bucket`` set (the folder's name), and
  :func:`manifest_count` the ``samples`` the manifest records for that bucket.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from shardsmith.atomic import read_json
from shardsmith.errors import UserError

from shardsmith.formats.build_dir import HOLDOUT_DIR, LEDGER_FILE, MANIFEST_FILE
from shardsmith.formats.detect import enclosing_build
from shardsmith.formats.wds import BUCKETS_INDEX_FILE


class BuildUnreadable(UserError):
    """The build folder's ledger cannot be read (damaged, not a database): names it and the way on."""


_SQLITE_IOERR, _SQLITE_FULL = 10, 13  # SQLite's primary result codes (an extended code's low byte)


def _mount_point(path: Path) -> Path:
    p = path.resolve()
    while not p.exists() and p != p.parent:
        p = p.parent
    while not os.path.ismount(p) and p != p.parent:
        p = p.parent
    return p


def no_room_to_read(path: Path, exc: BaseException) -> str | None:
    """The message for a ledger (or other file) at ``path`` that could not be opened because its disk is full
    or failed to read or write (SQLite's "disk I/O error" / "database or disk is full", an ``OSError`` ENOSPC,
    EDQUOT or EIO): not damage, so the fix is room on that filesystem, then the same command again. None for
    any other error (a file that is not a database, a malformed one: damage)."""
    import errno
    import sqlite3

    from shardsmith.safety.space import FULL_ERRNOS, free_bytes

    if isinstance(exc, sqlite3.OperationalError):
        code = getattr(exc, "sqlite_errorcode", None)
        text = str(exc)
        io = (code is not None and (code & 0xFF) in (_SQLITE_IOERR, _SQLITE_FULL)) or "disk I/O error" in text \
            or "disk is full" in text
    elif isinstance(exc, OSError):
        io = exc.errno in FULL_ERRNOS or exc.errno == errno.EIO
    else:
        io = False
    if not io:
        return None
    from shardsmith.scan import human_bytes

    mount = _mount_point(path.parent)
    try:
        free = f"{human_bytes(free_bytes(path.parent))} free there"
    except OSError:
        free = "its free space unknown"
    return (f"{path} cannot be read ({exc}): the disk is full or failed to write, not the ledger damaged (SQLite "
            f"writes beside a database to open it; {free}). Free space on {mount} (the filesystem holding "
            f"{path.parent}) and run again")


def _version(text: Any) -> tuple[int, ...] | None:
    parts = str(text).split(".")[:2]
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else None


def manifest_problem(mpath: Path) -> str | None:
    """What is wrong with the build manifest at ``mpath`` (not JSON, not a shardsmith manifest, a shape
    this version does not read, written by a newer shardsmith), or None when it reads (or is absent)."""
    from shardsmith import __version__

    fix = ("restore it from a copy, or rebuild into a new --out (shardsmith inspect checks the shards "
           "without it)")
    try:
        m = read_json(mpath)
    except FileNotFoundError:
        return None
    except ValueError as exc:
        return f"{mpath} is not valid JSON ({exc}); {fix}"
    except OSError as exc:
        return f"{mpath} cannot be read ({exc.strerror or exc}); {fix}"
    if not isinstance(m, dict):
        return f"{mpath} holds a JSON {type(m).__name__}, not a shardsmith manifest (an object); {fix}"
    theirs, ours = _version(m.get("shardsmith_version")), _version(__version__)
    if theirs is not None and ours is not None and theirs > ours:
        return (f"{mpath} was written by shardsmith {m.get('shardsmith_version')}, newer than this one "
                f"({__version__}); verify it with that version (pip install -U shardsmith)")
    why = manifest_shape_problem(m)
    if why is None:
        return None
    return f"{mpath} is not a shardsmith manifest this version reads ({why}); {fix}"


def _is_count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def outputs_mismatch(entries: dict[str, Any], want: list[str]) -> str | None:
    """What a manifest's ``outputs`` entries lack or hold beyond the recipe's output names ``want``, or None."""
    lacks = [n for n in want if n not in entries]
    extra = [n for n in entries if n not in want]
    if not lacks and not extra:
        return None
    return "; ".join(x for x in (f"no entry for output(s) {', '.join(lacks)} of the recipe" if lacks else "",
                                 f"entries for output(s) {', '.join(extra)} the recipe does not have"
                                 if extra else "") if x)


def manifest_shape_problem(m: dict[str, Any]) -> str | None:
    """What of a parsed manifest (a dict) is not the shape this version reads, or None: the keys ``build``
    (a re-run of a finished build), the CLI, the API, ``report`` and ``verify`` read: ``outputs`` an
    object of entries, each with ``format``, ``counts``, ``files`` and ``splits`` (a split whose files
    name a folder or file has a ``written`` count), and the totals ``counts.inputs`` / ``counts.written``.
    The text names the key (``outputs.wds.splits.train.written is missing or not a count``)."""
    outs = m.get("outputs")
    if not isinstance(outs, dict):
        return "outputs is not an object" if "outputs" in m else "outputs is missing"
    for name, out in outs.items():
        files = out.get("files", {}) if isinstance(out, dict) else None
        splits = out.get("splits", {}) if isinstance(out, dict) else None
        if not isinstance(files, dict) or not isinstance(splits, dict):
            return f"outputs.{name} is not a shardsmith manifest entry (no files / splits objects)"
        for split, info in files.items():
            if not isinstance(info, dict):
                return f"outputs.{name}.files.{split} is not an object"
            if info.get("dir") is None and info.get("path") is None:
                continue
            written = (splits.get(split) or {}).get("written") if isinstance(splits.get(split, {}), dict) else None
            if not _is_count(written):
                return f"outputs.{name}.splits.{split}.written is missing or not a count"
        if not isinstance(out.get("format"), str):
            return f"outputs.{name}.format is missing"
        if not isinstance(out.get("counts"), dict):
            return f"outputs.{name}.counts is missing or not an object"
    counts = m.get("counts")
    if not isinstance(counts, dict):
        return "counts is missing or not an object"
    for key in ("inputs", "written"):
        if not _is_count(counts.get(key)):
            return f"counts.{key} is missing or not a count"
    return None


def manifest_recipe_problem(build: BuildRef, dataset: Path) -> str | None:
    """What the manifest of ``build`` (a ledger and a manifest beside it) lacks of the recipe its ledger
    recorded: an output of the recipe it has no entry for, an entry of no output of the recipe, or no entry
    for ``dataset`` itself (its folder or file under ``files``); None when they match (or either cannot be
    read: other checks say that)."""
    mpath = build.root / MANIFEST_FILE
    try:
        m = read_json(mpath)
        recipe = _recorded_recipe(build.root)
    except (OSError, ValueError, BuildUnreadable):
        return None
    if not isinstance(m, dict) or not isinstance(m.get("outputs"), dict):
        return None
    want = [o["name"] for o in recipe.get("outputs") or [] if isinstance(o, dict) and isinstance(o.get("name"), str)]
    fix = ("restore manifest.json from a copy, or rebuild with the same command and --overwrite (shardsmith "
           "inspect checks the shards without it)")
    said = outputs_mismatch(m["outputs"], want)
    if said is not None:
        return (f"{mpath} does not match the recipe the build's ledger recorded "
                f"(outputs {', '.join(want) or 'none'}): {said}; {fix}")
    rel = Path(dataset).resolve().relative_to(build.root).as_posix()
    if build.bucket is not None:  # a bucket folder: the manifest names its output's folder
        rel = PurePosixPath(rel).parent.as_posix()
    if _manifest_entry(mpath, rel) is None:
        return (f"{mpath}: outputs.{build.output}.files.{build.split} does not name {rel}, which the build wrote "
                f"(output {build.output}, split {build.split}); {fix}")
    return None


def _manifest_entry(mpath: Path, rel: str) -> tuple[str, str, int] | None:
    """(output, split, written) of the output the manifest at ``mpath`` writes to ``rel``
    (relative to the manifest's folder), or None (also for a manifest :func:`manifest_problem` refuses)."""
    if manifest_problem(mpath) is not None:
        return None
    m = read_json(mpath)
    for name, out in m["outputs"].items():
        for split, info in (out.get("files") or {}).items():
            if rel in (info.get("dir"), info.get("path")):
                return name, split, out["splits"][split]["written"]
    return None


def dataset_manifest_problem(dataset: Path) -> tuple[str | None, str | None]:
    """(failure, note) about the manifest of the build folder at or above ``dataset``: the failure of
    check ``manifest`` when that manifest is a shardsmith build's (a ledger beside it, or its
    ``shardsmith_version``) and :func:`manifest_problem` refuses it; a note when a ``manifest.json`` that
    is no shardsmith manifest sits above (another tool's file: no manifest check, said); else (None, None)."""
    found = enclosing_build(dataset)
    if found is None or not found.has_manifest:
        return None, None
    mpath = found.root / MANIFEST_FILE
    why = manifest_problem(mpath)
    if why is None:
        return None, None
    try:
        ours = "shardsmith_version" in read_json(mpath)
    except (OSError, ValueError, TypeError):
        ours = False
    if found.has_ledger or ours:
        return why, None
    return None, f"{why}; taken for another tool's file: no manifest check"


def manifest_count(dataset: Path) -> tuple[int | None, str | None]:
    """Written count recorded by the shardsmith build that produced ``dataset``, if any: the
    manifest of the nearest build folder above ``dataset``."""
    found = enclosing_build(dataset.resolve().parent)
    if found is None or not found.has_manifest:
        return None, None
    mpath = found.root / MANIFEST_FILE
    rel = dataset.resolve().relative_to(found.root).as_posix()
    entry = _manifest_entry(mpath, rel)
    if entry is None:
        return _manifest_bucket_count(mpath, rel)
    name, split, written = entry
    return written, f"{mpath} output {name} split {split}"


def manifest_buckets(mpath: Path, rel: str) -> dict[str, dict[str, Any]] | None:
    """The ``buckets`` the manifest at ``mpath`` records for the output written to ``rel`` (``{bucket: {"dir",
    "samples", ...}}``), or None (no such output, or not a multi-bucket one)."""
    if _manifest_entry(mpath, rel) is None:
        return None
    for out in read_json(mpath)["outputs"].values():
        for info in (out.get("files") or {}).values():
            if isinstance(info, dict) and rel in (info.get("dir"), info.get("path")):
                buckets = info.get("buckets")
                return buckets if isinstance(buckets, dict) and buckets else None
    return None


def _manifest_bucket_count(mpath: Path, rel: str) -> tuple[int | None, str | None]:
    """(samples, where) the manifest records for the bucket folder ``rel`` of a multi-bucket output, else
    ``(None, None)``."""
    p = PurePosixPath(rel)
    if p.parent == PurePosixPath("."):
        return None, None
    buckets = manifest_buckets(mpath, p.parent.as_posix())
    for bucket, entry in (buckets or {}).items():
        if isinstance(entry, dict) and entry.get("dir", bucket) == p.name and _is_count(entry.get("samples")):
            name, split, _ = _manifest_entry(mpath, p.parent.as_posix())
            return entry["samples"], f"{mpath} output {name} split {split} bucket {bucket}"
    return None, None


@dataclass(frozen=True)
class BuildRef:
    """The shardsmith build folder that wrote a dataset, and which output and split the dataset is.
    ``complete``: a manifest is there and the ledger (when there is one) marks the build complete."""

    root: Path
    output: str
    split: str
    has_ledger: bool
    has_manifest: bool
    complete: bool
    #: a bucket folder of a multi-bucket output (one WebDataset folder per bucket beside ``buckets.json``): the
    #: folder's name in the output's folder, which prefixes its shards' names in the ledger and manifest
    bucket: str | None = None


def _recorded_recipe(root: Path) -> dict:
    """The recipe the ledger of the build at ``root`` recorded, read only (a read-only build is read as it
    is: ``Ledger.peek``); a ledger that cannot be read is a :class:`BuildUnreadable`."""
    import sqlite3

    from shardsmith.plan.ledger import Ledger

    ledger = root / LEDGER_FILE
    try:
        recipe, _ = Ledger.peek(ledger, "recipe", "complete")
    except (sqlite3.DatabaseError, ValueError, OSError) as exc:
        if (full := no_room_to_read(ledger, exc)) is not None:
            raise BuildUnreadable(full) from None
        if isinstance(exc, OSError):
            raise
        raise BuildUnreadable(f"the ledger {ledger} cannot be read ({exc}): it is damaged. The datasets "
                              f"themselves are checked without it by shardsmith inspect; rebuild into a new --out "
                              "to get a ledger again") from None
    return recipe if isinstance(recipe, dict) else {}


def _ledger_entry(root: Path, rel: str) -> tuple[str, str] | None:
    """(output, split) of the output the ledger's recorded recipe writes to ``rel``, or None."""
    from shardsmith.formats.zip import ZIP_FORMATS
    from shardsmith.split.assign import HOLDOUT, TRAIN

    for o in _recorded_recipe(root).get("outputs") or []:
        if not isinstance(o, dict) or not isinstance(o.get("name"), str):
            continue
        target = o.get("path") if o.get("format") in ZIP_FORMATS else o.get("dir")
        if not isinstance(target, str):
            continue
        target = PurePosixPath(target).as_posix()
        if rel == target:
            return o["name"], TRAIN
        if rel == f"{HOLDOUT_DIR}/{target}":
            return o["name"], HOLDOUT
    return None


def find_build(dataset: str | Path) -> BuildRef | None:
    """The build that wrote ``dataset``: the nearest folder at or above it holding a ledger or a
    manifest, when that build's recorded recipe (or manifest) has an output at ``dataset``. Reads only
    (a read-only build is fine); a damaged ledger is a :class:`BuildUnreadable`."""
    import sqlite3

    from shardsmith.plan.ledger import Ledger

    found = enclosing_build(dataset)
    if found is None:
        return None
    root, has_ledger, has_manifest = found.root, found.has_ledger, found.has_manifest
    rel = Path(dataset).resolve().relative_to(root).as_posix()

    def entry_of(rel: str) -> tuple[str, str] | None:
        if has_ledger:
            return _ledger_entry(root, rel)
        written = _manifest_entry(root / MANIFEST_FILE, rel)
        return written[:2] if written else None

    entry, bucket = entry_of(rel), None
    parent = PurePosixPath(rel).parent
    if entry is None and parent != PurePosixPath(".") and (root / parent / BUCKETS_INDEX_FILE).is_file():
        entry, bucket = entry_of(parent.as_posix()), PurePosixPath(rel).name  # a bucket folder of that output
    if entry is None:
        return None
    try:
        done = has_manifest and (not has_ledger or bool(Ledger.peek(root / LEDGER_FILE, "complete")[0]))
    except (sqlite3.DatabaseError, ValueError, OSError) as exc:
        full = no_room_to_read(root / LEDGER_FILE, exc)
        if full is None and isinstance(exc, OSError):
            raise
        raise BuildUnreadable(full or f"the ledger {root / LEDGER_FILE} cannot be read ({exc})") from None
    return BuildRef(root, entry[0], entry[1], has_ledger, has_manifest, done, bucket)


def _not_finished_why(root: Path, has_manifest: bool, complete: bool, named: bool = True) -> str | None:
    """Why the build at ``root`` (a ledger in it) is not finished, or None when it is: no manifest, or a
    ledger that does not mark it complete (``named``: the text names ``root``, else says "it")."""
    if has_manifest and complete:
        return None
    if not has_manifest:
        return f"{root if named else 'it'} has a ledger ({LEDGER_FILE}) but no {MANIFEST_FILE}"
    return f"its ledger {root / LEDGER_FILE if named else LEDGER_FILE} does not mark it complete"


def running_on(root: Path) -> str | None:
    """The holder of the build folder ``root``'s lock (a build running there now), or None; a lock that
    cannot be opened (a read-only build, another user's state folder) is None: nothing of ours runs there."""
    from shardsmith.safety.lock import holder

    try:
        return holder(root)
    except OSError:
        return None


def unfinished(build: BuildRef) -> str | None:
    """Why ``build`` is not finished (the message verify fails with), or None when it is."""
    why = None if build.complete else _not_finished_why(build.root, build.has_manifest, False)
    if why is None:
        return None
    running = running_on(build.root)
    now = f"; a build is running on it now ({running})" if running else ""
    return f"build not finished: resume it with the same command ({why}{now})"


@dataclass(frozen=True)
class UnfinishedBuild:
    """A shardsmith build folder that is not finished: ``why`` (no manifest, or not marked complete),
    ``command`` (``build``, or ``distill`` for a distillation build: the one that resumes it), ``datasets``
    (the datasets its recorded recipe writes, relative to ``root``: what to pass once it is finished) and
    ``running`` (the holder of its lock while a build runs there, else None)."""

    root: Path
    why: str
    command: str
    datasets: tuple[str, ...]
    running: str | None


def _recipe_datasets(recipe: dict) -> tuple[str, ...]:
    """The datasets (relative paths) a recorded recipe writes: each output's ``dir`` (``path`` for a ZIP),
    and below ``holdout/`` too when the recipe holds items out."""
    from shardsmith.formats.zip import ZIP_FORMATS

    targets = []
    for o in recipe.get("outputs") or []:
        target = o.get("path") if isinstance(o, dict) and o.get("format") in ZIP_FORMATS else \
            o.get("dir") if isinstance(o, dict) else None
        if isinstance(target, str) and target.strip():
            targets.append(PurePosixPath(target).as_posix())
    split = recipe.get("split")
    held = isinstance(split, dict) and bool(split.get("holdout"))
    return tuple(targets + ([f"{HOLDOUT_DIR}/{t}" for t in targets] if held else []))


def unfinished_build(path: str | Path) -> UnfinishedBuild | None:
    """The build ``path`` is, or lies inside, when that build is not finished (a ledger and no
    ``manifest.json``, or a ledger that does not mark it complete); None otherwise (no build above it, a
    finished one, or a ledger that cannot be read: the caller's own checks name that). Reads only."""
    import sqlite3

    from shardsmith.plan.ledger import Ledger

    found = enclosing_build(path)
    if found is None or not found.has_ledger:
        return None
    try:
        complete, recipe = Ledger.peek(found.root / LEDGER_FILE, "complete", "recipe")
    except (sqlite3.DatabaseError, ValueError, OSError):
        return None
    why = _not_finished_why(found.root, found.has_manifest, bool(complete), named=False)
    if why is None:
        return None
    recipe = recipe if isinstance(recipe, dict) else {}
    distill = any(isinstance(o, dict) and o.get("format") == "kd_wds" for o in recipe.get("outputs") or [])
    return UnfinishedBuild(found.root, why, "distill" if distill else "build", _recipe_datasets(recipe),
                           running_on(found.root))
