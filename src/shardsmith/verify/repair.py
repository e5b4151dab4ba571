"""Repair a WebDataset folder without ever losing data silently.

* A shard that is **cut short, has a damaged member header, or holds unsafe members** (``../x``,
  ``/abs/x``, links, device files) is rewritten from its intact samples. Reading resynchronises
  past a damaged header (at the next block whose header checksum is valid), so a bad header costs
  only the sample whose member it was; a sample is kept iff all its members are intact, and every
  dropped sample is listed by key and reason. Unsafe members are never copied. The new tar is
  first written beside the shard (:class:`DeterministicTar`, each member's bytes read again by
  offset and checked against the scan's sha256), re-read and compared member by member (name +
  sha256) with what was meant to be kept; only then is the original kept as ``<name>.orig`` (hard
  link or copy; never deleted) and the new tar renamed into place.
* A shard with a **corrupt member** is not rewritten: the sample's key goes into
  ``ignore_index.json`` (merged with what is there), which FastGen's loaders honour.
* ``shard_count.json`` is rebuilt from what a loader sees per shard, **before** ignores:
  FastGen subtracts ignored keys itself (reference/fastgen.md §2.7, §8).
* ``from_source=True``, for a dataset a shardsmith build wrote: each shard whose bytes differ from
  the build's is first rebuilt from the sources, byte-identical (:mod:`.from_source`); a source
  that changed or is gone refuses the repair before anything is written.
* Every change is appended to ``repair.json`` beside the shards (:class:`RepairEvent`: per shard,
  the samples dropped, ignored or restored, why, when); ``verify`` reads it to account for the loss.
* The folder's lock (the build folder's, for a dataset a shardsmith build wrote) is held for the
  whole run: a build or another repair in progress refuses it at once.
* A repair that cannot write what it changes (the dataset's folder; the state folder that holds the
  lock) is refused before any change (:func:`repair_lock`), naming those folders and fixes that work:
  make them writable, or repair a writable copy (``cp -a`` keeps read-only modes, so the copy is made
  writable too, and the dataset is named inside the copy). The build folder above them may be read-only.
* A dataset of an **unfinished build** (a ledger without ``manifest.json``, or one that does not mark
  the build complete: a build stopped or killed mid-way) is refused before anything is read or
  written (:func:`refuse_unfinished_build`). Repair is for a finished dataset damaged afterwards: an
  unfinished build holds only committed shards (each written to a temporary name, then renamed) and
  uncommitted temporary files its resume removes, so there is nothing for repair to fix, and a
  rewrite would leave shards the ledger did not record for the resume to finish around. The fix is
  to finish the build (re-running it resumes), then repair what is still damaged.

Non-adjacent members, duplicate members and dotted keys are reported but not changed.

Host memory stays bounded whatever the number of samples: the folder is inspected shard by shard
(:func:`~shardsmith.verify.inspect.scan_folder` keeps no sample runs), and a shard to rewrite is read
again, alone, when its turn comes (it must read as it did, or it is left as it was).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import shutil
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from shardsmith.errors import UserError
from shardsmith.formats.wds import (
    BACKUP_SUFFIX,
    BUCKETS_INDEX_FILE,
    IGNORE_INDEX_FILE,
    REPAIR_FILE,
    SHARD_COUNT_FILE,
    load_ignore_index,
    load_index_file,
    repair_log_document,
    repair_log_events,
)
from shardsmith.formats.wds import list_shards as wds_list_shards
from shardsmith.formats.build_dir import STATE_DIR
from shardsmith.formats.detect import enclosing_build
from shardsmith.safety.lock import FolderLockedError, FolderNotWritableError, hold, holder, lock_path
from shardsmith.atomic import atomic_open, atomic_write_json, fsync_dir
from shardsmith.sinks.tar import DeterministicTar
from shardsmith.verify.inspect import scan_folder
from shardsmith.verify.owning_build import BuildRef, BuildUnreadable, find_build, unfinished, unfinished_build
from shardsmith.verify.shard_scan import LostSample, ShardScan, scan_shard

CANDIDATE_SUFFIX = ".repaired"

REWRITTEN, IGNORED, RESTORED = "rewritten", "ignored_keys", "restored_from_source"
MISSING_SHARD = "missing_shard"  # a shard the build wrote, gone from the folder: its samples recorded as lost


class RepairError(UserError, RuntimeError):
    pass


# ----------------------------------------------------------------------------------------
# an unfinished build


def refuse_unfinished_build(dataset: str | Path, then: str, error: type[UserError] | None = None) -> None:
    """Raise ``error`` (a :class:`RepairError` by default) when ``dataset`` belongs to an unfinished build
    (:func:`~shardsmith.verify.owning_build.unfinished_build`), naming it and the fix: finish the build
    (re-running the same command resumes it), then ``then``, a text where ``{dataset}`` stands for the
    dataset to pass: the given path, or, for the build folder itself, its datasets (a build folder is
    refused by register, repair and verify, which take one of its datasets)."""
    from shardsmith.user_paths import resolve_user_path

    found = unfinished_build(dataset)
    if found is None:
        return
    root, given = found.root, Path(dataset)
    if resolve_user_path(given) == root:
        what = f"{given} is an unfinished build"
        paths = [str(root / d) for d in found.datasets]
        target = (paths[0] if len(paths) == 1 else f"one of its datasets ({', '.join(paths)})" if paths
                  else "one of its datasets")
    else:
        what, target = f"{given} is an output of the unfinished build {root}", str(given)
    after = then.format(dataset=target)
    if found.running:
        fix = f"a build is running on it now ({found.running}); wait for it to finish, then {after}"
    else:
        fix = (f"finish it: re-run the same `shardsmith {found.command} ... --out {root}` command (it resumes where "
               f"it stopped), then {after}")
    raise (error or RepairError)(f"{what} ({found.why}); {fix}")


#: what ``repair`` and ``register`` say to do once an unfinished build is finished (``{dataset}``: see
#: :func:`refuse_unfinished_build`)
REPAIR_THEN = "repair {dataset} if shardsmith verify still finds it damaged"
REGISTER_THEN = "register {dataset}"


# ----------------------------------------------------------------------------------------
# repair.json


@dataclass
class RepairEvent:
    """One change a repair made to one shard: an entry of ``repair.json``.

    ``dropped``: samples no longer in the shard; ``ignored``: samples added to
    ``ignore_index.json``; ``restored``: keys rebuilt from the sources (a restore puts the shard
    back as the build wrote it, so it cancels every earlier loss of that shard);
    ``dropped_members``: members left out of a rewrite that were no sample (unsafe, unkeyed);
    ``sha256``: the rewritten shard's, or the shard's as a repair that only ignored keys left it (``verify``'s
    check ``integrity`` compares the file with it).
    Action ``missing_shard``: a shard the build wrote was gone; ``dropped`` lists the samples the build
    wrote into it (keys from its ledger; None without one)."""

    time: str
    shard: str
    action: str  # REWRITTEN | IGNORED | RESTORED
    samples_before: int
    samples_after: int
    dropped: list[LostSample] = field(default_factory=list)
    ignored: list[LostSample] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)
    dropped_members: list[str] = field(default_factory=list)
    backup: str | None = None
    sha256: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "RepairEvent":
        d = dict(d)
        for k in ("dropped", "ignored"):
            d[k] = [LostSample(x["key"], x["reason"]) for x in d.get(k, [])]
        return cls(**d)


@dataclass(frozen=True)
class AccountedLoss:
    """A sample a repair removed from a shard (dropped or ignored) and no later repair restored."""

    shard: str
    key: str | None
    reason: str


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def load_repair_log(folder: str | Path) -> list[RepairEvent]:
    """The events of ``folder``'s ``repair.json`` in order ([] without one); a file that is not one
    raises :class:`RepairError` (it is never overwritten blindly)."""
    path = Path(folder) / REPAIR_FILE
    data, err = load_index_file(path)
    if err:
        raise RepairError(f"{err}; fix or move it (repairs append to it, verify reads it)")
    if data is None:
        return []
    try:
        return [RepairEvent.from_json(e) for e in repair_log_events(data)]
    except (KeyError, TypeError, ValueError) as exc:
        raise RepairError(f"{path} is not {{\"repairs\": [event, ...]}} ({type(exc).__name__}: {exc}); "
                          "fix or move it (repairs append to it, verify reads it)") from None


def repair_losses(folder: str | Path) -> list[AccountedLoss]:
    """The samples repairs removed from ``folder`` and never restored, in the order they were removed."""
    return _losses(load_repair_log(folder))


def _losses(history: list[RepairEvent]) -> list[AccountedLoss]:
    """:func:`repair_losses` of the events ``history``."""
    lost: dict[str, list[AccountedLoss]] = {}
    for ev in history:
        if ev.action == RESTORED:
            lost.pop(ev.shard, None)
            continue
        lost.setdefault(ev.shard, []).extend(AccountedLoss(ev.shard, x.key, x.reason) for x in ev.dropped + ev.ignored)
    return [x for shard in lost.values() for x in shard]


def _append_repair_log(folder: Path, events: list[RepairEvent]) -> None:
    old = load_repair_log(folder)
    atomic_write_json(folder / REPAIR_FILE, repair_log_document([e.to_json() for e in old + events]))


# ----------------------------------------------------------------------------------------
# rewriting one shard


def _backup_name(path: Path) -> Path:
    cand = path.with_name(path.name + BACKUP_SUFFIX)
    i = 1
    while cand.exists():
        cand = path.with_name(f"{path.name}{BACKUP_SUFFIX}.{i}")
        i += 1
    return cand


def _keep_original(path: Path, backup: Path) -> None:
    """Make ``backup`` another name for the original bytes (hard link, else atomic copy)."""
    try:
        os.link(path, backup)
    except OSError:
        with open(path, "rb") as src, atomic_open(backup) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    fsync_dir(backup.parent)


def _put_in_place(candidate: Path, path: Path) -> str | None:
    """Keep ``path``'s bytes under a backup name (when it exists), then rename ``candidate`` to
    ``path``; returns the backup's name."""
    backup = None
    if path.exists():
        backup = _backup_name(path)
        _keep_original(path, backup)
    os.replace(candidate, path)
    fsync_dir(path.parent)
    return backup.name if backup else None


def _write_candidate(sc: ShardScan, cand: Path) -> list[tuple[str, str]]:
    """Write the kept samples' members of ``sc`` to ``cand``, each read again by offset and checked
    against the scan's sha256; returns the (name, sha256) written."""
    refs = [m for i in sc.kept for m in sc.runs[i].members]
    with open(sc.path, "rb") as src, atomic_open(cand) as f:
        tar = DeterministicTar(f)
        for m in refs:
            src.seek(m.data_offset)
            data = src.read(m.size)
            if hashlib.sha256(data).hexdigest() != m.sha256:
                raise RepairError(f"{sc.path.name}: {m.name} changed between two reads; nothing replaced")
            tar.add(m.name, data)
        tar.close()
    return [(m.name, m.sha256) for m in refs]


def _rewrite(sc: ShardScan) -> str | None:
    """Write the complete samples of ``sc`` to a verified candidate and swap it in; returns the
    name the original is kept under."""
    path = sc.path
    cand = path.with_name(path.name + CANDIDATE_SUFFIX)
    try:
        expected = _write_candidate(sc, cand)
        check = scan_shard(cand)
        got = [(m.name, m.sha256) for r in check.runs for m in r.members]
        if check.needs_rewrite or got != expected:
            raise RepairError(f"{path.name}: rewritten shard did not verify; nothing replaced")
    except BaseException:
        cand.unlink(missing_ok=True)
        raise
    return _put_in_place(cand, path)


def _left_out_members(rep: dict[str, Any]) -> list[str]:
    """Members a rewrite of the shard whose report section is ``rep`` does not copy that belong to no
    dropped sample: ``"name: why"``."""
    out = [f"{u['member']}: {u['reason']}" for u in rep["unsafe_members"]]
    out += [f"{n}: no suffix (webdataset skips it)" for n in rep["unkeyed_members"]]
    unsafe = {u["member"] for u in rep["unsafe_members"]}
    out += [s for s in rep["skipped_members"] if s.split(" (", 1)[0] not in unsafe]
    return out


# ----------------------------------------------------------------------------------------
# the repair


#: what a WebDataset repair writes in place (said when it cannot)
WDS_REWRITES = "rewrites damaged shards and their index files"


def _not_writable(blocked: list[Path], root: Path, dataset: Path, rewrites: str,
                  exc: OSError | None = None) -> RepairError:
    """The refusal of a repair that cannot write the folders ``blocked`` (the dataset's, or the state folder
    that holds the lock of ``root``: the build folder, or the dataset itself outside a build): repair
    ``rewrites`` (what it changes) in place and has no ``--out``, so the fix is to make them writable, or to
    repair a writable copy of ``root`` (``cp -a`` keeps the read-only modes: the copy is made writable too),
    naming the dataset ``dataset`` in that copy."""
    why = f" ({exc.strerror or exc}: {exc.filename or blocked[0]})" if exc is not None else ""
    names = " and ".join(str(b) for b in blocked)
    try:
        inner = Path(dataset).resolve().relative_to(Path(root).resolve()).as_posix()
    except ValueError:
        inner = "."
    copy = "COPY" if inner == "." else f"COPY/{inner}"
    return RepairError(
        f"{names} cannot be written{why}: repair {rewrites}, in place (it has no --out); make "
        f"{'it' if len(blocked) == 1 else 'them'} writable for this user (e.g. chmod -R u+w "
        f"{os.path.commonpath(blocked)}, or remount the disk read-write), or repair a writable copy "
        f"(cp -a {root} COPY; chmod -R u+w COPY; then shardsmith repair {copy}); `shardsmith repair --dry-run "
        f"{dataset}` reports what would change without writing")


def _lock_folder(lock_at: Path) -> Path:
    """The folder a repair must write to hold ``lock_at``'s lock: its state folder (its parent while there
    is none yet: the state folder is made there)."""
    state = lock_path(lock_at).parent
    return state if state.is_dir() else Path(lock_at)


def _check_writable(dataset: Path, lock_at: Path, writes: list[Path], rewrites: str) -> None:
    """Refuse (:func:`_not_writable`) before any change when a folder the repair writes cannot be written (a
    read-only disk or mount, no permission): the state folder of ``lock_at`` (its lock; the quarantine of a
    ``.precomputed/`` tree) and ``writes`` (the dataset's folders). Only those: the build folder above them
    may be read-only."""
    def there(p: Path) -> bool:  # (never a PermissionError: a folder this user may not look into is blocked)
        try:
            os.stat(p)
        except OSError:
            return False
        return True

    lock = lock_path(lock_at)
    needed = [(_lock_folder(lock_at), os.W_OK | os.X_OK), *((f, os.W_OK | os.X_OK) for f in writes)]
    if there(lock):
        needed.insert(1, (lock, os.W_OK))  # (opened for writing: its holder's text)
    blocked = list(dict.fromkeys(f for f, mode in needed if there(f) and not os.access(f, mode)))
    blocked = [f for f in blocked if f.parent not in blocked]  # (the lock of a state folder named already)
    if blocked:
        raise _not_writable(blocked, lock_at, dataset, rewrites)


@contextlib.contextmanager
def repair_lock(lock_at: Path, dry_run: bool, dataset: Path, writes: list[Path] | None = None,
                rewrites: str = WDS_REWRITES) -> Iterator[None]:
    """Hold ``lock_at``'s lock for a repair of ``dataset`` (a dry run, which writes nothing, only checks that
    it is free). A repair that cannot write what it must (:func:`_check_writable`: the lock's state folder
    and ``writes``, default the dataset folder) is refused as :func:`_not_writable` before any change, and so
    is a lock the file system refuses after that check."""
    if not dry_run:
        _check_writable(dataset, lock_at, [dataset] if writes is None else writes, rewrites)
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(hold(lock_at, "repair"))
            except FolderNotWritableError as exc:
                cause = exc.__context__ if isinstance(exc.__context__, OSError) else None
                raise _not_writable([_lock_folder(lock_at)], lock_at, dataset, rewrites, cause) from None
            yield
        return
    try:
        who = holder(lock_at)
    except OSError:  # a read-only folder: its lock cannot be opened to ask, and nothing can write there
        who = None
    if who:
        raise FolderLockedError(f"{lock_at} is in use by another shardsmith process ({who}); wait for it to finish "
                                "and re-run this command")
    yield


def repair_wds(folder: str | Path, *, dry_run: bool = False, from_source: bool = False,
               progress: Any = None) -> dict[str, Any]:
    """Repair ``folder`` in place (or only report with ``dry_run``); return what changed.

    Report keys: ``folder``, ``dry_run``, ``from_source``, ``shards`` ({name: {action (rewritten
    | ignored_keys | restored_from_source | unchanged), samples_before, samples_after, dropped
    ([{key, reason}]), dropped_keys, dropped_members, ignored_keys, restored, backup, notes}}),
    ``ignore_index`` ({path, added, removed, written}), ``shard_count`` ({path, before, after,
    changed, written}), ``repair_log`` ({path, events, written}), ``build`` (the build folder that
    wrote it, or None), ``errors`` and ``inspect`` (the inspect report taken before any change).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise RepairError(f"{folder} is not a folder; repair takes a WebDataset folder (the one holding NNNNN.tar)")
    refuse_unfinished_build(folder, REPAIR_THEN)
    try:
        build = find_build(folder)
        lock_at = build.root if build else folder
    except BuildUnreadable:  # a damaged ledger: the shards are repaired all the same (--from-source needs it)
        if from_source:
            raise
        build, lock_at = None, enclosing_build(folder).root
    if (folder / BUCKETS_INDEX_FILE).is_file() and not wds_list_shards(folder).names:
        raise RepairError(_buckets_message(folder, build, from_source))
    if from_source:
        _refuse_bucket_from_source(folder, build)
    if from_source and build is not None and not build.has_ledger:
        found = enclosing_build(folder)
        if found is not None and found.ledger_unreadable:  # (another user's build: its state folder is closed)
            raise RepairError(f"cannot read the ledger of the build {build.root}: permission denied on "
                              f"{build.root / STATE_DIR}; --from-source needs it. Run it as a user who can read it, "
                              f"or `shardsmith repair {folder}` without --from-source to keep every intact sample")
    if not from_source and not wds_list_shards(folder).names:  # nothing to repair: say why, write nothing
        why = unfinished(build) if build is not None else None
        raise RepairError(f"{folder} holds no .tar shards; repair takes a WebDataset folder of NNNNN.tar shards"
                          + (f" ({why})" if why else ""))
    with repair_lock(lock_at, dry_run, folder):
        restored = _restore(folder, build, dry_run) if from_source else {}
        missing = _missing_build_shards(folder, build, restored)
        report = _repair(folder, dry_run, restored, progress, missing, _build_record(build))
    report.update(from_source=from_source, build=str(build.root) if build else None, restore=_restore_way(build))
    return report


def _missing_build_shards(folder: Path, build: BuildRef | None, restored: dict[str, RepairEvent]) -> list[dict[str, Any]]:
    """The shards the build that wrote ``folder`` committed (its ledger, else its manifest) that are not in
    it (and were not restored just now): ``[{shard, samples, keys, where, renamed_to, recorded_at}]``;
    ``keys``: the samples the build wrote into it ([] without a ledger); ``renamed_to``: a ``.tar`` here that
    the build did not write holding its very bytes (a renamed shard, not a loss); ``recorded_at``: the time
    of the repair that already recorded its loss in repair.json (None: found now)."""
    from shardsmith.verify.from_source import sha256_file
    from shardsmith.verify.integrity import build_units, unit_keys

    got = build_units(build)
    if got is None:
        return []
    units, where = got
    present = set(wds_list_shards(folder).names)
    gone = [u for u in units if u.count > 0 and u.name not in present and u.name not in restored]
    if not gone:
        return []
    recorded: dict[str, str | None] = {}
    for ev in load_repair_log(folder):
        recorded[ev.shard] = ev.time if ev.action == MISSING_SHARD else None
    extra = sorted(present - {u.name for u in units})
    out = []
    for u in gone:
        renamed = None
        for name in extra:
            p = folder / name
            if (u.bytes is None or p.stat().st_size == u.bytes) and sha256_file(p) == u.sha256:
                renamed = name
                break
        keys = unit_keys(build, u.name) or []
        out.append({"shard": u.name, "samples": u.count, "keys": keys, "where": where, "renamed_to": renamed,
                    "recorded_at": recorded.get(u.name)})
    return out


def _missing_reason(m: dict[str, Any]) -> str:
    return f"its shard {m['shard']}, written by the build, is missing (shardsmith repair --from-source restores it)"


def _missing_event(m: dict[str, Any]) -> RepairEvent:
    why = _missing_reason(m)
    dropped = [LostSample(k, why) for k in m["keys"]] or [LostSample(None, why) for _ in range(m["samples"])]
    return RepairEvent(_now(), m["shard"], MISSING_SHARD, m["samples"], 0, dropped=dropped)


def missing_lines(report: dict[str, Any]) -> list[str]:
    """The loud lines about lost samples: those of each shard a rewrite lost samples of (:func:`_loss_lines`),
    then the shards the build wrote that are missing (see :func:`_missing_build_shards`)."""
    out = _loss_lines(report)
    folder = report["folder"]
    for m in report.get("missing_shards") or []:
        head = f"{m['shard']}, written by the build ({m['samples']} sample(s); {m['where']}), is missing"
        if m["renamed_to"]:
            out.append(f"{head}: {m['renamed_to']}, which the build did not write, holds its very bytes (a renamed "
                       f"shard); rename it back: mv {Path(folder) / m['renamed_to']} {Path(folder) / m['shard']}")
            continue
        keys = ", ".join(m["keys"][:5]) + (", ..." if len(m["keys"]) > 5 else "")
        lost = f"{m['samples']} sample(s) lost" + (f" ({keys})" if keys else "")
        said = (f"recorded in {REPAIR_FILE} by the repair of {m['recorded_at']}" if m["recorded_at"]
                else f"recorded in {REPAIR_FILE}" if not report["dry_run"] else f"would be recorded in {REPAIR_FILE}")
        fix = (f"`shardsmith repair --from-source {folder}` rebuilds it byte-identical from the build's sources"
               if "ledger" in m["where"] else "restore it from a copy (the build's ledger, which --from-source "
               "needs, is gone)")
        out.append(f"{head}: {lost}, {said}; {fix}")
    return out


def _restore(folder: Path, build: BuildRef | None, dry_run: bool) -> dict[str, RepairEvent]:
    """Put every damaged shard back as the build wrote it (see :mod:`.from_source`); one event per shard."""
    from shardsmith.verify.from_source import rebuild_damaged

    events: dict[str, RepairEvent] = {}
    for r in rebuild_damaged(folder, build, dry_run=dry_run):
        path = folder / r.unit.name
        before = scan_shard(path) if path.exists() else None
        old = {} if before is None else {run.key: [(m.name, m.sha256) for m in run.members]
                                         for i, run in enumerate(before.runs) if i in before.kept}
        ev = RepairEvent(_now(), r.unit.name, RESTORED, samples_before=len(old), samples_after=r.unit.count,
                         restored=[k for k, members in r.members.items() if old.get(k) != members])
        if r.candidate is not None:
            ev.backup = _put_in_place(r.candidate, path)
        events[r.unit.name] = ev
    return events


def _shard_entry(rep: dict[str, Any]) -> dict[str, Any]:
    return {"action": "unchanged", "samples_before": rep["samples"], "samples_after": rep["samples"],
            "dropped": [], "dropped_keys": [], "dropped_members": [], "ignored_keys": [], "restored": [],
            "backup": None, "notes": [], "sha256": None, "unseen": 0}


def _needs_rewrite(rep: dict[str, Any]) -> bool:
    """As :attr:`ShardScan.needs_rewrite`, from the shard's report section."""
    return bool(rep["truncated"] or rep["damaged_headers"] or rep["unsafe_members"])


# the report fields the folder pass fills in (scan_shard leaves them empty)
_FOLDER_FIELDS = frozenset({"dotted_members", "minority_suffixes"})


def _read_again(path: Path, rep: dict[str, Any]) -> ShardScan:
    """Read the shard whose inspect section is ``rep`` again, for its sample runs (the inspection
    keeps none); a shard that reads differently now raises :class:`RepairError`."""
    sc = scan_shard(path)
    if any(sc.report[k] != rep[k] for k in sc.report if k not in _FOLDER_FIELDS):
        raise RepairError(f"{path.name}: changed since it was inspected; nothing replaced")
    return sc



@dataclass
class _BuildRecord:
    """What the build that wrote the folder committed per shard (:func:`~.integrity.build_units`: its ledger,
    else its manifest): ``units`` by shard name, ``where`` that is recorded; :meth:`keys`: the keys of the
    samples it wrote into a shard (its ledger's; None without one, or for a bucket folder's shard)."""

    build: BuildRef
    units: dict[str, Any]
    where: str

    def keys(self, shard: str) -> list[str] | None:
        import sqlite3

        from shardsmith.verify.integrity import unit_keys

        try:
            return unit_keys(self.build, shard)
        except (sqlite3.Error, OSError):
            return None


def _build_record(build: BuildRef | None) -> _BuildRecord | None:
    from shardsmith.verify.integrity import build_units

    got = build_units(build)
    return None if got is None else _BuildRecord(build, {u.name: u for u in got[0]}, got[1])


def _damage(rep: dict[str, Any]) -> str:
    """What is wrong with the shard whose inspect section is ``rep``, in a few words."""
    said = []
    if rep["truncated"]:
        said.append(f"cut short ({rep['truncated']['kind']} at byte {rep['truncated']['break_offset']})")
    said += [f"a damaged tar header at byte {d['offset']}" for d in rep["damaged_headers"]]
    if rep["unsafe_members"]:
        said.append(f"{len(rep['unsafe_members'])} unsafe member(s)")
    return ", ".join(said) or "damaged"


def _all_lost(name: str, sc: ShardScan, rep: dict[str, Any], record: _BuildRecord | None,
              earlier: list[AccountedLoss]) -> tuple[list[LostSample], int]:
    """Every sample a rewrite of the shard ``name`` (scan ``sc``, inspect section ``rep``) loses, and how many
    of them the file no longer shows at all. The scan names the samples it finds damaged (``sc.dropped``);
    a file cut short also lost the samples that lay past the cut, which only a record says: the build's (the
    keys its ledger wrote into the shard, else the count its manifest recorded, less what earlier repairs
    recorded), else ``shard_count.json``'s count. A sample the scan could not name takes its key from the
    ledger."""
    dropped = sc.dropped
    kept = {sc.runs[i].key for i in sc.kept}
    unnamed = [d for d in dropped if d.key is None]
    named = [d for d in dropped if d.key is not None]
    before = [x for x in earlier if x.shard == name]  # lost to earlier repairs, recorded then
    unit = record.units.get(name) if record is not None else None
    keys = record.keys(name) if unit is not None else None
    damage = _damage(rep)
    if keys is not None:
        known = kept | {d.key for d in named} | {x.key for x in before}
        lost = [k for k in keys if k not in known]
        in_file = {r.key for r in sc.runs}
        why = {k: (f"not in the file, which is {damage} before this sample" if rep["truncated"] and k not in in_file
                   else f"the damaged file ({damage}) holds no intact copy of it")
               + f"; the build wrote it into {name} ({record.where})" for k in lost}
        return named + [LostSample(k, why[k]) for k in lost] + unnamed[len(lost):], max(0, len(lost) - len(unnamed))
    if unit is not None:
        total = unit.count - len(before)
        source = f"the build wrote {unit.count} sample(s) into it ({record.where})" + (
            f", {len(before)} of them lost to earlier repairs (in {REPAIR_FILE})" if before else "")
    elif isinstance(rep.get("count_file"), int):
        total, source = rep["count_file"], f"{SHARD_COUNT_FILE} said {rep['count_file']} sample(s)"
    else:
        return dropped, 0
    unseen = max(0, total - len(kept) - len(dropped))
    why = (f"{source}; the file, {damage}, shows {len(kept) + len(dropped)} of them: this one is not in it "
           f"(its key is unknown: {_keys_unknown(record if unit is not None else None)})")
    return dropped + [LostSample(None, why) for _ in range(unseen)], unseen


def _keys_unknown(record: _BuildRecord | None) -> str:
    """Why the keys of a shard's lost samples are unknown (``record``: the build's, where it records the shard)."""
    if record is None:
        return "no build ledger records the shard's keys"
    build = record.build
    if not build.has_ledger:
        return "the build's ledger, which records them, is gone (its manifest records only the count)"
    if build.bucket is not None:
        return (f"the build's ledger records the samples of each unit it wrote, not which of them went into "
                f"bucket {build.bucket}'s shard")
    return f"the build's {record.where} cannot be read"


def _rewrite_entry(path: Path, rep: dict[str, Any], entry: dict[str, Any], dry_run: bool,
                   errors: list[str], record: _BuildRecord | None = None,
                   earlier: list[AccountedLoss] | None = None) -> set[str] | None:
    """Rewrite the shard at ``path`` (inspect section ``rep``) from its intact samples (or say what
    would be) and record it in ``entry`` with every sample it loses (:func:`_all_lost`; ``record``: the
    build's, ``earlier``: the losses repair.json records); returns the keys the rewritten shard keeps (None
    when it stays as it was). Only this shard's sample runs are held, while it is rewritten."""
    try:
        sc = _read_again(path, rep)
    except (RepairError, OSError) as e:
        errors.append(str(e))
        entry["notes"].append(f"rewrite failed, shard left as it was: {e}")
        return None
    dropped, unseen = _all_lost(path.name, sc, rep, record, earlier or [])
    entry.update(action=REWRITTEN, samples_before=len(sc.kept) + len(dropped), samples_after=len(sc.kept),
                 dropped=[dataclasses.asdict(d) for d in dropped], unseen=unseen, damage=_damage(rep),
                 dropped_keys=[d.key for d in dropped if d.key is not None],
                 dropped_members=_left_out_members(rep))
    if isinstance(rep.get("count_file"), int) and rep["count_file"] > len(sc.kept):
        entry["notes"].append(
            f"{SHARD_COUNT_FILE} said {rep['count_file']} samples: {rep['count_file'] - len(sc.kept)} "
            "are not recoverable from this file (the original bytes stay in the backup)")
    if rep["truncated"]:
        t = rep["truncated"]
        entry["notes"].append(f"{t['kind']} at byte {t['break_offset']}: kept {len(sc.kept)} complete sample(s)")
    for d in rep["damaged_headers"]:
        entry["notes"].append(f"damaged tar header at byte {d['offset']}: "
                              + (f"read on from byte {d['resumed_at']}" if d["resumed_at"] is not None
                                 else "no valid header follows"))
    kept = {sc.runs[i].key for i in sc.kept}
    if dry_run:
        entry["backup"] = _backup_name(sc.path).name
        return kept
    try:
        entry["backup"] = _rewrite(sc)
        from shardsmith.verify.from_source import sha256_file

        entry["sha256"] = sha256_file(path)  # what verify's check integrity compares the shard with now
    except (RepairError, OSError) as e:
        errors.append(str(e))
        entry.update(action="unchanged", samples_before=rep["samples"], samples_after=rep["samples"], dropped=[],
                     dropped_keys=[], dropped_members=[], unseen=0)
        entry["notes"].append(f"rewrite failed, shard left as it was: {e}")
        return None
    return kept


def _corrupt_keys(rep: dict[str, Any], kept: set[str] | None) -> list[tuple[str, str]]:
    """(key, reason) of the samples with a corrupt member that stay in the shard: those among
    ``kept`` when it was rewritten, else all (a corrupt member always belongs to a sample)."""
    out: dict[str, str] = {}
    for c in rep["corrupt"]:
        if (kept is None or c["key"] in kept) and c["key"] not in out:
            out[c["key"]] = f"corrupt member {c['member']}: {c['error']}"
    return list(out.items())


def _event(name: str, entry: dict[str, Any], ignored: list[LostSample]) -> RepairEvent | None:
    """The repair.json event for one shard's entry, or None when nothing changed."""
    if entry["action"] == "unchanged" and not ignored:
        return None
    return RepairEvent(_now(), name, entry["action"], entry["samples_before"], entry["samples_after"],
                       dropped=[LostSample(d["key"], d["reason"]) for d in entry["dropped"]], ignored=ignored,
                       dropped_members=list(entry["dropped_members"]), backup=entry["backup"],
                       sha256=entry.get("sha256"))


def _repair(folder: Path, dry_run: bool, restored: dict[str, RepairEvent], progress: Any = None,
            missing: list[dict[str, Any]] | None = None, record: _BuildRecord | None = None) -> dict[str, Any]:
    """The repair proper, after any restore from the sources (``progress``: a bar over the shards);
    ``missing``: the shards the build wrote that are gone (:func:`_missing_build_shards`): the loss of each
    found now is recorded (unless another ``.tar`` holds its bytes: a renamed shard); ``record``: what the
    build committed (:func:`_build_record`), which names the samples a cut-short shard lost past the cut."""
    before = scan_folder(folder, progress=progress)
    errors: list[str] = []
    shards: dict[str, Any] = {}
    add_ignore: dict[str, list[str]] = {}
    already, ierr = load_ignore_index(folder)
    if ierr:
        raise RepairError(f"{ierr}; fix or move it before repairing (it is never overwritten blindly)")
    already = already or {}
    history = load_repair_log(folder)
    earlier = _losses(history)
    events: list[RepairEvent] = list(restored.values())
    counts_after: dict[str, int] = {}

    for rep in before["shards"]:
        name = rep["name"]
        entry = _shard_entry(rep)
        kept: set[str] | None = None
        if name in restored:
            ev = restored[name]
            entry.update(action=RESTORED, samples_before=ev.samples_before, samples_after=ev.samples_after,
                         restored=ev.restored, backup=ev.backup)
            entry["notes"].append("rebuilt from the sources, byte-identical to the build" + (
                f" ({len(ev.restored)} sample(s) restored)" if not dry_run else ""))
        elif _needs_rewrite(rep):
            kept = _rewrite_entry(folder / name, rep, entry, dry_run, errors, record, earlier)
        bad = _corrupt_keys(rep, kept) if name not in restored else []
        new = [(k, why) for k, why in bad if k not in already.get(name, [])]
        if new:
            add_ignore[name] = [k for k, _ in new]
            entry["ignored_keys"] = add_ignore[name]
            if entry["action"] == "unchanged":
                entry["action"] = IGNORED
                if not dry_run:  # its bytes stay as they are: what verify's check integrity compares it with now
                    from shardsmith.verify.from_source import sha256_file

                    entry["sha256"] = sha256_file(folder / name)
        already_listed = [k for k, _ in bad if k in already.get(name, [])]
        if already_listed:
            entry["notes"].append(f"already in {IGNORE_INDEX_FILE}: {already_listed}")
        for label, items in (("non-adjacent members", rep["non_adjacent"]),
                             ("duplicate members", rep["duplicate_members"]),
                             ("dotted keys", rep["dotted_members"])):
            if items:
                entry["notes"].append(f"{len(items)} {label} reported, not changed (needs a rebuild)")
        ev = None if name in restored else _event(name, entry, [LostSample(k, why) for k, why in new])
        if ev is not None:
            events.append(ev)
        counts_after[name] = entry["samples_after"]
        shards[name] = entry

    for m in missing or []:
        if m["renamed_to"]:
            continue
        ev = _missing_event(m)
        shards[m["shard"]] = {**_shard_entry({"samples": m["samples"]}), "action": MISSING_SHARD, "samples_after": 0,
                              "dropped": [dataclasses.asdict(d) for d in ev.dropped], "dropped_keys": list(m["keys"]),
                              "notes": []}
        if m["recorded_at"] is None:
            events.append(ev)
        else:
            shards[m["shard"]]["notes"] = [f"its loss was recorded by the repair of {m['recorded_at']}"]
            shards[m["shard"]]["dropped"] = []

    ign = _update_ignore_index(folder, already, add_ignore, _unignore(history, restored), dry_run)
    for m in missing or []:  # a renamed shard is counted under the name the build gave it: renaming it back is the
        if m["renamed_to"] in counts_after:  # whole fix (the count file then matches the folder again)
            counts_after[m["shard"]] = counts_after.pop(m["renamed_to"])
    counts_after = dict(sorted(counts_after.items()))
    cnt = _update_shard_count(folder, counts_after, dry_run, bool(before["shards"]))
    if events and not dry_run:
        _append_repair_log(folder, events)
    return {
        "folder": str(folder),
        "dry_run": dry_run,
        "shards": shards,
        "ignore_index": ign,
        "shard_count": cnt,
        "repair_log": {"path": str(folder / REPAIR_FILE), "events": [e.to_json() for e in events],
                       "written": bool(events) and not dry_run},
        "errors": errors,
        "missing_shards": list(missing or []),
        "inspect": before,
    }


def _unignore(history: list[RepairEvent], restored: dict[str, RepairEvent]) -> dict[str, list[str]]:
    """Per restored shard, the keys earlier repairs put into ignore_index.json: restored, they go."""
    out: dict[str, list[str]] = {}
    for ev in history:
        if ev.shard in restored and ev.ignored:
            out.setdefault(ev.shard, []).extend(x.key for x in ev.ignored if x.key is not None)
    return out


def _update_ignore_index(folder: Path, already: dict[str, list[str]], add: dict[str, list[str]],
                         remove: dict[str, list[str]], dry_run: bool) -> dict[str, Any]:
    """Merge ``add`` into ignore_index.json and take out ``remove`` (keys repair itself added for
    shards now restored); no other existing entry is ever dropped."""
    path = folder / IGNORE_INDEX_FILE
    merged = {k: list(v) for k, v in already.items()}
    removed: dict[str, list[str]] = {}
    for shard, keys in remove.items():
        gone = [k for k in merged.get(shard, []) if k in keys]
        if gone:
            removed[shard] = gone
            merged[shard] = [k for k in merged[shard] if k not in keys]
    for shard, keys in add.items():
        merged.setdefault(shard, [])
        merged[shard].extend(k for k in keys if k not in merged[shard])
    merged = {k: v for k, v in merged.items() if v or not already.get(k, [''])}  # (a restore can empty one)
    written = False
    if (add or removed) and not dry_run:
        atomic_write_json(path, merged)
        written = True
    return {"path": str(path), "added": add, "removed": removed, "written": written}


def _update_shard_count(folder: Path, counts_after: dict[str, int], dry_run: bool, any_shard: bool) -> dict[str, Any]:
    """shard_count.json: samples per shard as a loader sees them, before ignores (the old file kept)."""
    path = folder / SHARD_COUNT_FILE
    old, err = load_index_file(path)
    if err or not isinstance(old, (dict, type(None))):
        old = None
    changed = old != counts_after
    written = False
    if changed and not dry_run and any_shard:
        if path.exists():
            _keep_original(path, _backup_name(path))  # never delete data silently
        atomic_write_json(path, counts_after)
        written = True
    return {"path": str(path), "before": old, "after": counts_after, "changed": changed, "written": written}


def format_repair(report: dict[str, Any]) -> str:
    """Human-readable rendering of :func:`repair_wds`'s report."""
    head = "dry run: nothing written" if report["dry_run"] else "repair"
    lines = [f"{head}: {report['folder']}"]
    for name, e in report["shards"].items():
        line = f"  {name:<20} {e['action']:<20} {e['samples_before']} -> {e['samples_after']} samples"
        if e["restored"]:
            line += f"; restored {e['restored']}"
        if e["ignored_keys"]:
            line += f"; ignored {e['ignored_keys']}"
        if e["backup"]:
            line += f"; original kept as {e['backup']}"
        lines.append(line)
        lines.extend(f"      - dropped {d['key'] or '(unnamed sample)'}: {d['reason']}" for d in e["dropped"])
        lines.extend(f"      - left out member {m}" for m in e["dropped_members"])
        lines.extend(f"      - {n}" for n in e["notes"])
    sc = report["shard_count"]
    if sc["changed"]:
        lines.append(f"  {SHARD_COUNT_FILE}: {sc['before']} -> {sc['after']}")
    if report["ignore_index"]["added"]:
        lines.append(f"  {IGNORE_INDEX_FILE}: added {report['ignore_index']['added']}")
    if report["ignore_index"].get("removed"):
        lines.append(f"  {IGNORE_INDEX_FILE}: removed {report['ignore_index']['removed']} (restored from the sources)")
    log = report.get("repair_log") or {}
    if log.get("events"):
        lines.append(f"  {REPAIR_FILE}: {len(log['events'])} change(s) "
                     + ("recorded" if log["written"] else "would be recorded"))
    lines.extend(f"  WARNING {m}" for m in missing_lines(report))
    lines.extend(f"  ERROR {e}" for e in report["errors"])
    return "\n".join(lines)


def lost_now(report: dict[str, Any]) -> bool:
    """Whether this repair found a shard the build wrote missing (its loss not recorded before, or renamed), or
    a shard the build wrote cut short before samples the file no longer shows at all (only the build's record
    names them, as for a missing shard): ``shardsmith repair`` then exits 1."""
    return any(m["recorded_at"] is None or m["renamed_to"] for m in report.get("missing_shards") or []) or (
        bool(report.get("build")) and any(e.get("unseen") for e in report["shards"].values()))


def _loss_lines(report: dict[str, Any]) -> list[str]:
    """One line per shard a rewrite lost samples of: its damage, how many of its samples are lost and every key
    (the first ten here; all in the lines above and in repair.json), where that is recorded, and how to get them
    back (:func:`_way_back`)."""
    out = []
    for name, e in report["shards"].items():
        if e["action"] != REWRITTEN or not e["dropped"]:
            continue
        keys = [d["key"] for d in e["dropped"] if d["key"] is not None]
        unnamed = len(e["dropped"]) - len(keys)
        shown = ", ".join(keys[:10]) + (f", ... ({len(keys) - 10} more, every key listed above and in {REPAIR_FILE})"
                                        if len(keys) > 10 else "")
        if unnamed:
            shown += f"{' and ' if keys else ''}{unnamed} whose key is unknown"
        said = f"would be recorded in {REPAIR_FILE}" if report["dry_run"] else f"recorded in {REPAIR_FILE}"
        out.append(f"{name} is {e.get('damage') or 'damaged'}: {len(e['dropped'])} of its {e['samples_before']} "
                   f"sample(s) lost ({shown}), {said}; {_way_back(report, e)}")
    return out


def _way_back(report: dict[str, Any], entry: dict[str, Any]) -> str:
    """How to get back the samples a rewrite of a shard lost (entry ``entry`` of ``report``)."""
    folder, kept = report["folder"], f"the original bytes stay in {entry['backup']}"
    way = report.get("restore")
    if way == "from_source":
        return f"`shardsmith repair --from-source {folder}` rebuilds it byte-identical from the build's sources"
    return f"{kept}; to get them back, {way or 'restore the shard from a copy'}"


def _restore_way(build: BuildRef | None) -> str | None:
    """How the samples a repair loses come back for a dataset of ``build``: ``"from_source"`` (a ledger, an image
    WebDataset output: what ``repair --from-source`` rebuilds), the text of another way for another build, None
    without one."""
    if build is None:
        return None
    if not build.has_ledger:
        return "restore the shard from a copy (the build's ledger, which --from-source needs, is gone)"
    fmt = _output_format(build)
    if fmt == "wds" and build.bucket is None:
        return "from_source"
    return (f"{_rebuild(build.root)}; repair --from-source rebuilds image WebDataset shards (format wds) only, this "
            f"output is format {fmt}")


def _rebuild(root: Path) -> str:
    return (f"rebuild the output from its sources: re-run the build's command with --overwrite (shardsmith build ... "
            f"--out {root} --overwrite: built beside the old one and swapped in when complete)")


def _output_format(build: BuildRef) -> str | None:
    """The format of the output of ``build`` a dataset is (the recipe its ledger recorded, else its manifest), or
    None."""
    from shardsmith.atomic import read_json
    from shardsmith.formats.build_dir import MANIFEST_FILE
    from shardsmith.verify.owning_build import _recorded_recipe

    try:
        if build.has_ledger:
            outs = _recorded_recipe(build.root).get("outputs") or []
            return next((o.get("format") for o in outs if isinstance(o, dict) and o.get("name") == build.output), None)
        fmt = read_json(build.root / MANIFEST_FILE)["outputs"][build.output]["format"]
        return fmt if isinstance(fmt, str) else None
    except (BuildUnreadable, OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


# ----------------------------------------------------------------------------------------
# a multi-bucket output: one WebDataset folder per bucket


def _from_source_not_for(output: str, fmt: str | None) -> str:
    return (f"--from-source rebuilds image WebDataset shards (format wds) only, and output {output!r} is format "
            f"{fmt or 'unknown'}")


def _refuse_bucket_from_source(folder: Path, build: BuildRef | None) -> None:
    """Refuse ``--from-source`` for a bucket folder of a build's output (a latent output: not what it rebuilds),
    naming the build (two folders up: ``find_build`` gives it with ``bucket`` set, as verify finds it) and what
    works instead. It used to say the folder was "not written by a shardsmith build"."""
    if build is None or build.bucket is None:
        return
    raise RepairError(f"{folder} is bucket {build.bucket} of output {build.output!r} of the build {build.root}: "
                      f"{_from_source_not_for(build.output, _output_format(build))}. Run `shardsmith repair {folder}` "
                      f"without --from-source to keep every intact sample, or {_rebuild(build.root)}")


def _buckets_message(folder: Path, build: BuildRef | None, from_source: bool) -> str:
    """The refusal of a multi-bucket output's own folder (``buckets.json`` and one folder per bucket, no shard):
    repair takes each bucket's folder, named."""
    from shardsmith.formats.wds import is_bucket_folder

    subs = sorted(d for d in folder.iterdir() if d.is_dir() and is_bucket_folder(d.name) and wds_list_shards(d).names)
    said = (f"{folder} holds no .tar shards: it is a multi-bucket dataset (one WebDataset folder per bucket beside its "
            f"{BUCKETS_INDEX_FILE}), and repair takes one bucket's folder at a time")
    if not subs:
        return said + f"; none of its bucket folders holds a shard (`shardsmith verify {folder}` says what is lost)"
    runs = ", ".join(f"`shardsmith repair {d}`" for d in subs)
    if not from_source:
        return f"{said}: {runs}"
    fmt = _output_format(build) if build is not None else None
    if fmt == "wds":  # (no such output today: only latent outputs are written per bucket)
        return f"{said}: " + ", ".join(f"`shardsmith repair --from-source {d}`" for d in subs)
    why = _from_source_not_for(build.output, fmt) if build is not None else "--from-source rebuilds the shards of a " \
        "shardsmith build's image WebDataset output (format wds) only"
    rebuild = f", or {_rebuild(build.root)}" if build is not None else ""
    return f"{said}; {why}. Repair each without it to keep every intact sample: {runs}{rebuild}"


#: the shards (and keys) :func:`unaccounted_loss` names at most
SHORT_SHOWN = 10


def unaccounted_loss(dataset: Path, expected: Any) -> str:
    """What verify's check ``manifest`` adds when the build's dataset ``dataset`` holds fewer samples than its
    manifest records, less the losses ``repair.json`` accounts for (e.g. a repair by an older shardsmith that
    did not record every sample a cut-short shard lost): the shards that are short (by the counts the build
    recorded per shard, against ``expected``, the :class:`~.expected.ExpectedWds` of a full pass), with a
    ledger the keys no record accounts for, and the fix that gets them back (:func:`_restore_way`); "" when
    none is found. Keys are read for the first :data:`SHORT_SHOWN` short shards only."""
    try:
        build = find_build(dataset)
        record = _build_record(build)
        losses = repair_losses(dataset)
    except (UserError, OSError):
        return ""
    if record is None:
        return ""
    per_shard: dict[str, list[AccountedLoss]] = {}
    for x in losses:
        per_shard.setdefault(x.shard, []).append(x)
    short: list[tuple[str, int, list[str] | None]] = []  # (shard, samples unaccounted, their keys)
    listed: list[str] = []  # keys ignore_index.json lists that no repair recorded
    for name, unit in record.units.items():
        i = expected.shard_index(name)
        held = 0 if i is None else expected.offsets[i + 1] - expected.offsets[i]
        ignored = list(expected.ignore.get(name, ())) if i is not None else []
        gone = unit.count - held - len(per_shard.get(name, []))
        if gone <= 0:
            continue
        keys = record.keys(name) if len(short) < SHORT_SHOWN else None
        if keys is not None:
            known = (set(expected.keys(i)) if i is not None else set()) | {x.key for x in per_shard.get(name, [])}
            keys = [k for k in keys if k not in known]
            listed += [f"{name}/{k}" for k in keys if k in ignored]
            keys = [k for k in keys if k not in ignored]
            gone = len(keys)
        if gone > 0:
            short.append((name, gone, keys))
    said = []
    if short:
        n = sum(g for _, g, _ in short)
        named = [f"{sh}/{k}" for sh, _, keys in short for k in (keys or [])]
        what = (", ".join(named[:SHORT_SHOWN]) + (", ..." if len(named) > SHORT_SHOWN else "") if named
                else ", ".join(f"{sh} ({g})" for sh, g, _ in short[:SHORT_SHOWN]))
        way = _restore_way(build)
        fix = (f"`shardsmith repair --from-source {dataset}` rebuilds their shard(s) byte-identical from the "
               "build's sources" if way == "from_source" else way)
        said.append(f"{n} sample(s) the build wrote ({record.where}) are neither in the dataset nor accounted "
                    f"in {REPAIR_FILE}: {what}; {fix}")
    if listed:
        said.append(f"{IGNORE_INDEX_FILE} lists {', '.join(listed[:SHORT_SHOWN])}"
                    + (", ..." if len(listed) > SHORT_SHOWN else "")
                    + f" but no repair recorded them (a repair records each key it ignores in {REPAIR_FILE}): "
                      f"take them out of it, then run `shardsmith repair {dataset}`, which ignores again, and "
                      "records, any that are damaged")
    return "; ".join(said)
