"""Check ``integrity``: the shards of a dataset a shardsmith build wrote hold the bytes the build committed.

Contract
- Only for a WebDataset folder a shardsmith build wrote (``owning_build.find_build``): the shards the
  build committed and their sha256 are read from its ledger (``from_source.recorded_units``: the same
  records ``repair --from-source`` restores from), else, without a ledger, from its manifest
  (``outputs.NAME.files.SPLIT.shards``). A bucket folder of a multi-bucket output (``lat/64x64x17``) is
  checked against the files the build recorded for that bucket (the ledger's ``unit_files``, the manifest's
  shards named ``64x64x17/NNNNN.tar``). Any other dataset gets no such check.
- Each committed shard must be there and hash to the recorded sha256 (``from_source.unit_damage``: a
  file of another size differs without being read). ``repair.json`` is taken into account: a shard a
  repair rewrote (or left as it was, ignoring its damaged samples) must hold what that repair saw (its
  event's ``sha256``; an event without one, from an older shardsmith, is not checked and said in the
  detail), a shard restored from the sources the
  build's bytes again, and a missing shard whose loss a repair recorded (action ``missing_shard``) is
  accounted for. A ``.tar`` in the folder that the build did not write is named too (a renamed shard).
- The failure names each shard and the fix: ``shardsmith repair --from-source`` (with a ledger, for an
  image WebDataset output, format ``wds``: the one it rebuilds), which rebuilds the build's shards
  byte-identical; for another format the build's command again with ``--overwrite``; else restoring the
  file, or ``shardsmith repair``, which keeps what is intact and records the loss.
- Cost: every byte of every shard is hashed once (sha256, ~1.7 GB/s a core with SHA extensions). The
  hashing runs in threads of the verify process (hashlib releases the GIL) while the ranks iterate the
  loader (:meth:`ShardIntegrity.start` after the ranks are forked, :meth:`ShardIntegrity.finish` after
  they are collected), so it overlaps the loader's run instead of adding to it; for data not in the page
  cache, the loader and the hashing read the same files, once from the disk.
"""

from __future__ import annotations

import functools
import os
import sqlite3
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from shardsmith.formats.build_dir import LEDGER_FILE, MANIFEST_FILE
from shardsmith.formats.wds import NEG_PROMPT_SHA_KEY  # (the manifest key of neg_prompt_emb.npy's sha256)
from shardsmith.verify.from_source import DIFFERS, MISSING, Unit, recorded_units, sha256_file, unit_damage
from shardsmith.verify.owning_build import BuildRef

SHOWN = 5


def _said(parts: list[str], sep: str, label: str, names: list[str]) -> None:
    """Add ``N label: a<sep>b<sep>...`` (the first :data:`SHOWN` names) to ``parts`` where ``names`` holds any."""
    if names:
        parts.append(f"{len(names)} {label}: " + sep.join(names[:SHOWN]) + (f"{sep}..." if len(names) > SHOWN else ""))


def hash_threads() -> int:
    """Threads that hash shards beside the loader: a quarter of the cores, 1 to 4."""
    return max(1, min(4, (os.cpu_count() or 1) // 4))


def _read_ledger(build: BuildRef):
    from shardsmith.plan.ledger import Ledger, is_read_only_error

    path = build.root / LEDGER_FILE
    try:
        return Ledger(path)
    except sqlite3.OperationalError as exc:  # a finished dataset made read-only: read it as it is
        if not is_read_only_error(exc):
            raise
        return Ledger._immutable(path)


def _in_bucket(build: BuildRef, name: str) -> str | None:
    """``name`` (a file the build recorded, ``64x64x17/00000.tar`` for a bucket's) relative to the dataset
    ``build`` is, or None when it is not in it (another bucket's)."""
    if build.bucket is None:
        return name
    head = f"{build.bucket}/"
    return name[len(head):] if name.startswith(head) else None


def _ledger_units(build: BuildRef) -> list[Unit]:
    led = _read_ledger(build)
    try:
        if build.bucket is None:
            return recorded_units(led, build.output, build.split)
        return [Unit(n, f["seq"], f["count"], f["sha256"], f["bytes"]) for f in led.unit_files(build.output, build.split)
                if (n := _in_bucket(build, f["name"])) is not None]
    finally:
        led.close()


def unit_keys(build: BuildRef, shard: str) -> list[str] | None:
    """The keys of the samples the build wrote into ``shard`` (from its ledger), or None without one (or for a
    bucket's shard: the ledger records the items of the unit, not of each bucket's file)."""
    if not build.has_ledger or build.bucket is not None:
        return None
    led = _read_ledger(build)
    try:
        return [key for sh, key, _ in led.written_ids(build.output, build.split) if sh == shard]
    finally:
        led.close()


def build_units(build: BuildRef | None) -> tuple[list[Unit], str] | None:
    """The shards the build that wrote a dataset committed, and where that is recorded (its ledger, else its
    manifest), or None (no build, or neither can be read)."""
    if build is None:
        return None
    try:
        units, where = _recorded(build)
    except (sqlite3.Error, OSError):
        return None
    return None if units is None else (units, where)


def _recorded(build: BuildRef) -> tuple[list[Unit] | None, str]:
    """The build's committed shards (None: its manifest does not list them) and where they are recorded: its
    ledger where it has one (a ledger that cannot be read raises ``sqlite3.Error`` / ``OSError``), else its manifest."""
    if build.has_ledger:
        return _ledger_units(build), f"ledger {build.root / LEDGER_FILE}"
    return _manifest_units(build), f"manifest {build.root / MANIFEST_FILE}"


def _manifest_units(build: BuildRef) -> list[Unit] | None:
    from shardsmith.atomic import read_json

    try:
        m = read_json(build.root / MANIFEST_FILE)
        shards = m["outputs"][build.output]["files"][build.split]["shards"]
        return [Unit(n, i, int(s["count"]), str(s["sha256"]), s.get("bytes"))
                for i, s in enumerate(shards) if isinstance(s, dict) and s.get("name") and s.get("sha256")
                and (n := _in_bucket(build, str(s["name"]))) is not None]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def output_format(build: BuildRef) -> str | None:
    """The format of the build's output the dataset is (its manifest's ``outputs.NAME.format``), or None."""
    from shardsmith.atomic import read_json

    try:
        fmt = read_json(build.root / MANIFEST_FILE)["outputs"][build.output]["format"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return fmt if isinstance(fmt, str) else None


def rebuild_fix(build: BuildRef) -> str:
    """How to get back the bytes of an output ``repair --from-source`` does not rebuild (any format but ``wds``)."""
    return (f"restore the file(s) from a copy, or rebuild the output from its sources: re-run the build's command "
            f"with --overwrite (shardsmith build ... --out {build.root} --overwrite: built beside the old one and "
            "swapped in when complete; repair --from-source rebuilds image WebDataset shards only)")


@dataclass
class _Expect:
    """What one committed shard must hold now: the build's bytes (``sha256`` None: the unit's), what a
    repair wrote (``sha256``; ``unknown``: an event that did not record it), or nothing (``lost``: a repair
    recorded its loss)."""

    unit: Unit
    sha256: str | None = None
    by: str = "the build"
    unknown: bool = False
    lost: bool = False


def _expectations(dataset: Path, units: list[Unit]) -> list[_Expect]:
    from shardsmith.verify.repair import IGNORED, MISSING_SHARD, REWRITTEN, RESTORED, RepairError, load_repair_log

    exp = {u.name: _Expect(u) for u in units}
    try:
        log = load_repair_log(dataset)
    except RepairError:  # said by check repair_log (verify/accounting.py)
        log = []
    for ev in log:
        e = exp.get(ev.shard)
        if e is None:
            continue
        if ev.action == RESTORED:
            exp[ev.shard] = _Expect(e.unit)
        elif ev.action in (REWRITTEN, IGNORED):  # (a shard repair left as it was, its damaged samples ignored)
            sha = getattr(ev, "sha256", None)
            exp[ev.shard] = _Expect(e.unit, sha, f"the repair of {ev.time}", unknown=sha is None)
        elif ev.action == MISSING_SHARD:
            exp[ev.shard] = _Expect(e.unit, lost=True, by=f"the repair of {ev.time}")
    return list(exp.values())


class _Hashing:
    """Hashing on a thread pool of its own while the ranks run: :meth:`start` submits the jobs once (call it
    after forking the ranks: no thread of this process may be running across a fork), :meth:`close` stops it
    (what has not started is cancelled), :meth:`_collect` waits for the results and closes."""

    _pool: ThreadPoolExecutor | None = None
    THREADS: int | None = None  # None: hash_threads()

    def _submit(self, pool: ThreadPoolExecutor) -> None:
        raise NotImplementedError

    def start(self) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.THREADS or hash_threads(), thread_name_prefix="shardsmith-hash")
            self._submit(self._pool)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def _collect(self, get):
        """``get()`` (reading the futures) once the jobs are submitted, then close."""
        self.start()
        try:
            return get()
        finally:
            self.close()


class ShardIntegrity(_Hashing):
    """Check ``integrity`` of one dataset (see the module doc): :meth:`start` the hashing, :meth:`finish`
    to add the check. Made by :func:`shard_integrity`."""

    def __init__(self, dataset: Path, build: BuildRef, units: list[Unit], where: str):
        self.dataset, self.build, self.where = dataset, build, where
        self.expect = _expectations(dataset, units)
        self._futures: dict[str, Future] = {}

    def _one(self, e: _Expect) -> tuple[str | None, str | None]:
        """(damage, error): :data:`MISSING` / :data:`DIFFERS` / None, or the error reading it."""
        if e.unknown:
            return (MISSING if not (self.dataset / e.unit.name).is_file() else None), None
        try:
            return unit_damage(self.dataset, e.unit, e.sha256), None
        except OSError as exc:
            return None, exc.strerror or str(exc)

    def _submit(self, pool: ThreadPoolExecutor) -> None:
        """Every shard, the largest first: the threads finish together."""
        todo = sorted(self.expect, key=lambda e: -(e.unit.bytes or 0))
        self._futures = {e.unit.name: pool.submit(self._one, e) for e in todo}

    def finish(self, check) -> None:
        """Wait for the hashes and add check ``integrity``."""
        got = self._collect(lambda: {name: f.result() for name, f in self._futures.items()})
        from shardsmith.loaders.shard_reader import list_shards

        wrote = {e.unit.name for e in self.expect}
        extra = [n for n in list_shards(self.dataset) if n not in wrote]
        missing, differs, unreadable, lost, unknown = [], [], [], [], []
        for e in self.expect:
            damage, err = got[e.unit.name]
            if err is not None:
                unreadable.append(f"{e.unit.name} cannot be read ({err})")
            elif damage == MISSING and e.lost:
                lost.append(e.unit.name)
            elif damage == MISSING:
                missing.append(f"{e.unit.name} ({e.unit.count} sample(s))")
            elif damage == DIFFERS:
                differs.append(e.unit.name + ("" if e.sha256 is None else f" (against what {e.by} wrote)"))
            elif e.unknown:
                unknown.append(e.unit.name)
        n = len(self.expect)
        if not (missing or differs or unreadable or extra):
            detail = (f"the {n - len(lost)} shard(s) the build wrote hold the bytes it committed (sha256, as its "
                      f"{self.where} records)")
            if lost:
                detail += f"; {len(lost)} missing shard(s) accounted for in repair.json ({', '.join(lost[:SHOWN])})"
            if unknown:
                detail += (f"; {len(unknown)} shard(s) rewritten by a repair that recorded no sha256, not "
                           f"compared: {', '.join(unknown[:SHOWN])}")
            check("integrity", True, detail)
            return
        parts: list[str] = []
        said = functools.partial(_said, parts, ", ")
        said("shard(s) whose bytes differ from the sha256 the build recorded", differs)
        said("shard(s) the build wrote are missing", missing)
        said("shard(s) cannot be read", unreadable)
        said(".tar file(s) the build did not write", extra)
        ds = self.dataset
        if self.build.has_ledger and output_format(self.build) not in (None, "wds"):
            fix = rebuild_fix(self.build)
        elif self.build.has_ledger:
            fix = (f"`shardsmith repair --from-source {ds}` rebuilds the build's shards byte-identical from its "
                   f"sources (`shardsmith repair {ds}` without it keeps what is intact and records the loss)")
        else:
            fix = (f"restore them from a copy (the build's ledger, which --from-source needs, is gone), or run "
                   f"`shardsmith repair {ds}` to keep what is intact and record the loss")
        if extra and missing:
            fix = f"a renamed shard: give it back its name ({missing[0].split(' ')[0]}); else {fix}"
        elif extra:
            fix = f"move the file(s) the build did not write out of {ds}; {fix}"
        check("integrity", False, "; ".join(parts) + f" (the build's {self.where}); {fix}")


def shard_integrity(dataset: Path, build: BuildRef | None) -> tuple[ShardIntegrity | None, str | None]:
    """The integrity check of ``dataset`` (a WebDataset folder), or None and why not (a note) / None (no
    build wrote it: nothing to say)."""
    if build is None:
        return None, None
    try:
        units, where = _recorded(build)
    except (sqlite3.Error, OSError) as exc:
        return None, f"integrity not checked: the ledger {build.root / LEDGER_FILE} cannot be read ({exc})"
    if units is None:
        return None, None
    return ShardIntegrity(Path(dataset), build, units, where), None



# ---------------------------------------------------------------- .precomputed/ trees

#: the file (below the quarantine of a tree, one per repair run) in which ``repair`` lists the files it moved
_QUARANTINE_LOG = "repair.json"


@dataclass
class _TreeUnit:
    """A unit of a ``.precomputed/`` tree as the build committed it: the relative path (``sample_rel``) of each
    sample it wrote, in the order it hashed them (None: an item the recorded recipe cannot name)."""

    unit: Unit
    rels: list[str | None]


def _tree_units(build: BuildRef) -> list[_TreeUnit]:
    """The committed units of the tree ``build`` is and the files of each, from its ledger and recorded recipe
    (raises on a ledger or recipe that cannot be read)."""
    from shardsmith.recipe import recipe_from_dict
    from shardsmith.verify.decode import Samples

    led = _read_ledger(build)
    try:
        recipe = recipe_from_dict(led.get_meta("recipe"), base_dir="/", origin=f"{build.root} (recorded recipe)")
        samples = Samples(led.items(split=build.split, status="ok"), recipe, build.output)
        rel_of = {it.idx: rel for rel, it in samples.by_rel.items()}
        return [_TreeUnit(u, [rel_of.get(idx) for idx, _, _ in led.written(build.output, build.split, shard=u.name)])
                for u in recorded_units(led, build.output, build.split)]
    finally:
        led.close()


def _tree_member_files(root: Path, rel: str) -> list[str]:
    """The files of sample ``rel`` in the tree (``latents/x.pt``, ``conditions/x.pt`` ...), sorted as the sink
    hashed them."""
    from shardsmith.formats.precomputed import WRITTEN_DIRS

    return sorted(f"{d}/{rel}" for d in WRITTEN_DIRS if (root / d / rel).is_file())


def tree_unit_sha256(root: Path, rels: list[str]) -> str:
    """The sha256 the ``.precomputed/`` sink records for a unit whose samples are ``rels`` (in order), over the
    files the tree holds now: every file's path and the sha256 of its bytes (``sinks.precomputed.write_unit``)."""
    import hashlib

    h = hashlib.sha256()
    for rel in rels:
        for member in _tree_member_files(root, rel):
            h.update(member.encode() + b"\0" + bytes.fromhex(sha256_file(root / member)))
    return h.hexdigest()


def _quarantined(root: Path) -> set[str]:
    """The files (``latents/x.pt`` ...) that repairs of the tree moved into its quarantine."""
    from shardsmith.atomic import read_json
    from shardsmith.verify.precomputed_inspect import quarantine_dir

    moved: set[str] = set()
    base = quarantine_dir(root)
    for log in sorted(base.glob(f"*/{_QUARANTINE_LOG}")) if base.is_dir() else []:
        try:
            moved.update(str(m["file"]) for m in read_json(log).get("moved") or [] if isinstance(m, dict))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return moved


class TreeIntegrity(_Hashing):
    """Check ``integrity`` of a ``.precomputed/`` tree a shardsmith build wrote: each unit the build committed
    must hash, over the files its samples have in the tree now, to the sha256 its ledger recorded (the sink's
    hash of every file's path and bytes, recomputed); a ``.pt`` that no sample of the build has is named too.
    The ledger records one sha256 per unit, not per file, so a unit that differs is named with its files (one
    of them changed, was swapped with another or is gone). A unit a ``repair`` moved files of (into the
    quarantine) is not compared, and said. Same interface as :class:`ShardIntegrity`."""

    def __init__(self, root: Path, build: BuildRef, units: list[_TreeUnit]):
        self.root, self.build, self.units = root, build, units
        self.moved = _quarantined(root)
        self._futures: list[Future] = []

    def _one(self, tu: _TreeUnit) -> tuple[str | None, list[str], str | None]:
        """(damage, the rels whose every file is gone, error): :data:`DIFFERS` or None."""
        rels = [r for r in tu.rels if r is not None]
        gone = [r for r in rels if not _tree_member_files(self.root, r)]
        try:
            return (None if tree_unit_sha256(self.root, rels) == tu.unit.sha256 else DIFFERS), gone, None
        except OSError as exc:
            return None, gone, exc.strerror or str(exc)

    def _submit(self, pool: ThreadPoolExecutor) -> None:
        self._futures = [pool.submit(self._one, tu) for tu in self.units]

    def _extra(self) -> list[str]:
        """The ``.pt`` files of the tree's folders that no sample the build wrote has."""
        from shardsmith.formats.precomputed import WRITTEN_DIRS, cache_files

        ours = {r for tu in self.units for r in tu.rels if r is not None}
        return [f"{d}/{rel}" for d in WRITTEN_DIRS if (self.root / d).is_dir()
                for rel in cache_files(self.root, d) if rel not in ours]

    def finish(self, check) -> None:
        got = self._collect(lambda: [f.result() for f in self._futures])
        differs, missing, unreadable, not_compared = [], [], [], []
        moved = {m.split("/", 1)[1] for m in self.moved if "/" in m}  # (the samples' rels)
        for tu, (damage, gone, err) in zip(self.units, got):
            rels = [r for r in tu.rels if r is not None]
            if len(rels) != len(tu.rels) or any(r in moved for r in rels):
                not_compared.append(tu.unit.name)
                continue
            files = [f for r in rels for f in _tree_member_files(self.root, r)]
            if err is not None:
                unreadable.append(f"{tu.unit.name} ({err})")
            elif gone:
                missing.append(f"{tu.unit.name}: {len(gone)} sample(s) with no file left: "
                               + ", ".join(gone[:SHOWN]) + (", ..." if len(gone) > SHOWN else ""))
            elif damage == DIFFERS:
                differs.append(f"{tu.unit.name} ({len(rels)} sample(s), files " + ", ".join(files[:SHOWN])
                               + (", ..." if len(files) > SHOWN else "") + ")")
        extra = self._extra()
        where = f"ledger {self.build.root / LEDGER_FILE}"
        n = len(self.units)
        if not (differs or missing or unreadable or extra):
            detail = (f"the files of the {n - len(not_compared)} unit(s) the build wrote hash to the sha256 it "
                      f"committed (as its {where} records)")
            if not_compared:
                detail += (f"; {len(not_compared)} unit(s) a repair moved files of (into the quarantine), or whose "
                           f"samples the recorded recipe cannot name, not compared: {', '.join(not_compared[:SHOWN])}")
            check("integrity", True, detail)
            return
        parts: list[str] = []
        said = functools.partial(_said, parts, "; ")
        said("unit(s) whose files no longer hash to the sha256 the build recorded (the ledger records one per unit, "
             "not per file: one of these files changed, was swapped with another or is gone)", differs)
        said("unit(s) the build wrote have samples whose files are all gone", missing)
        said("unit(s) whose files cannot be read", unreadable)
        said(".pt file(s) the build did not write (a renamed or added file: the trainer reads it as a sample)",
             [", ".join(extra[:SHOWN]) + (", ..." if len(extra) > SHOWN else "")] if extra else [])
        fix = rebuild_fix(self.build)
        if extra:
            fix = f"move the file(s) the build did not write out of {self.root}; {fix}"
        check("integrity", False, "; ".join(parts) + f" (the build's {where}); {fix}")


def tree_integrity(root: Path, build: BuildRef | None) -> tuple[TreeIntegrity | None, str | None]:
    """The integrity check of the ``.precomputed/`` tree ``root``, or None and why not (a note) / None (no build
    wrote it: nothing to say)."""
    if build is None:
        return None, None
    if not build.has_ledger:
        return None, (f"integrity not checked: the build's ledger ({build.root / LEDGER_FILE}) is gone, and its "
                      "manifest records no sha256 of the tree's files")
    try:
        units = _tree_units(build)
    except Exception as exc:  # noqa: BLE001 - a ledger or recorded recipe this version cannot read: said, not fatal
        return None, f"integrity not checked: the ledger {build.root / LEDGER_FILE} cannot be read ({exc})"
    return TreeIntegrity(Path(root), build, units), None


# ---------------------------------------------------------------- an EDM ZIP, and the files beside the shards

def _manifest_files(build: BuildRef) -> dict | None:
    """The manifest's ``outputs.NAME.files.SPLIT`` block of the dataset ``build`` is, or None."""
    from shardsmith.atomic import read_json

    try:
        info = read_json(build.root / MANIFEST_FILE)["outputs"][build.output]["files"][build.split]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return info if isinstance(info, dict) else None


class ZipIntegrity(_Hashing):
    """Check ``integrity`` of an EDM ZIP a shardsmith build wrote: the file hashes to the sha256 its manifest
    records (``outputs.NAME.files.SPLIT.sha256``; a file of another size differs without being read). No repair
    rewrites a ZIP, so any change (an image, a label in ``dataset.json``) is damage. Same interface as
    :class:`ShardIntegrity`: hashed in a thread while the ranks run."""

    def __init__(self, path: Path, build: BuildRef, sha256: str, nbytes: int | None):
        self.path, self.build, self.sha256, self.nbytes = path, build, sha256, nbytes
        self._future: Future | None = None

    THREADS = 1  # one file

    def _one(self) -> tuple[str | None, str | None]:
        try:
            return unit_damage(self.path.parent, Unit(self.path.name, 0, 0, self.sha256, self.nbytes)), None
        except OSError as exc:
            return None, exc.strerror or str(exc)

    def _submit(self, pool: ThreadPoolExecutor) -> None:
        self._future = pool.submit(self._one)

    def finish(self, check) -> None:
        damage, err = self._collect(lambda: self._future.result())
        where = f"manifest {self.build.root / MANIFEST_FILE}"
        if err is None and damage is None:
            check("integrity", True, f"{self.path.name} holds the bytes the build wrote (sha256, as its {where} "
                                     "records)")
            return
        what = (f"{self.path.name} cannot be read ({err})" if err is not None else
                f"{self.path.name} is gone" if damage == MISSING else
                f"{self.path.name} does not hash to the sha256 the build recorded: its images or labels "
                "(dataset.json) changed since the build")
        check("integrity", False, f"{what} (the build's {where}); no repair rewrites a ZIP: "
                                  + rebuild_fix(self.build))


def zip_integrity(path: Path, build: BuildRef | None) -> tuple[ZipIntegrity | None, str | None]:
    """The integrity check of the EDM ZIP ``path``, or None and why not (a note) / None (no build wrote it)."""
    if build is None:
        return None, None
    info = _manifest_files(build)
    sha = info.get("sha256") if info else None
    if not isinstance(sha, str) or not sha:
        return None, f"integrity not checked: the build's manifest records no sha256 of {Path(path).name}"
    nbytes = info.get("bytes")
    return ZipIntegrity(Path(path), build, sha, nbytes if isinstance(nbytes, int) else None), None




def neg_prompt_check(folder: Path, build: BuildRef | None) -> tuple[bool | None, str] | None:
    """Check ``neg_prompt`` of a WebDataset output folder (not a bucket's: the file lies beside the buckets) whose
    build wrote ``neg_prompt_emb.npy`` beside its shards (its manifest's ``neg_prompt_emb``): the file must be
    there and, where the manifest records its sha256 (:data:`NEG_PROMPT_SHA_KEY`), hash to it. ``(ok, detail)``;
    ``(None, note)`` when there and not compared (the build recorded no sha256 of it); None when the build
    wrote none (or no build wrote the folder)."""
    if build is None or build.bucket is not None:
        return None
    info = _manifest_files(build)
    name = info.get("neg_prompt_emb") if info else None
    if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
        return None
    path = Path(folder) / name
    sha = info.get(NEG_PROMPT_SHA_KEY)
    where = f"manifest {build.root / MANIFEST_FILE}"
    fix = rebuild_fix(build)
    if not path.is_file():
        return False, (f"{name}, the negative prompt's embedding the build wrote beside the shards (its {where}), "
                       f"is gone: classifier-free guidance then has no negative condition; {fix}")
    if not isinstance(sha, str) or not sha:
        return None, (f"{name} not compared: the build's manifest records no sha256 of it (outputs.{build.output}"
                      f".files.{build.split}.{NEG_PROMPT_SHA_KEY}), so a changed file cannot be told")
    try:
        got = sha256_file(path)
    except OSError as exc:
        return False, f"{name} cannot be read ({exc.strerror or exc}); {fix}"
    if got != sha:
        return False, (f"{name} does not hash to the sha256 the build recorded (its {where}): the negative "
                       f"prompt's embedding changed since the build; {fix}")
    return True, f"{name} holds the negative prompt's embedding the build wrote (sha256, as its {where} records)"
