"""``repair --from-source``: rebuild damaged shards of a shardsmith build from its sources.

Contract
- Only for a dataset a shardsmith build wrote, with the build's ledger present, and an image
  WebDataset output (``format: wds``); anything else is a :class:`~shardsmith.errors.UserError`
  naming the fix.
- A shard is damaged when its file is missing or its sha256 differs from the one the ledger
  recorded when the build committed it.
- Before anything is written, every source item of every damaged shard is checked against the
  sha256 the ledger recorded; an item that changed or is gone refuses the whole repair, named.
- A shard is rebuilt with the build's own code: the items the ledger recorded as written into it,
  in plan order, made by :class:`~shardsmith.transform.samples.WdsSampleMaker` and written by
  :meth:`~shardsmith.sinks.wds.WdsSink.write_unit` into ``.shardsmith/repair/`` of the build
  folder. Only a candidate whose sha256 equals the ledger's is returned; putting it in place (and
  keeping the damaged file) is the caller's job.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from shardsmith.errors import UserError
from shardsmith.formats.build_dir import LEDGER_FILE, STATE_DIR
from shardsmith.formats.wds import member_name
from shardsmith.plan.ledger import Ledger
from shardsmith.recipe import Recipe, WdsOutput, recipe_from_dict
from shardsmith.records import WRITTEN, PlannedItem, SampleResult
from shardsmith.verify.owning_build import BuildRef

STAGING = f"{STATE_DIR}/repair"  # below the build folder: same file system as its shards


class FromSourceError(UserError):
    """``--from-source`` cannot rebuild this dataset (no build, a changed source, ...)."""


@dataclass(frozen=True)
class Unit:
    """A shard the ledger recorded as committed."""

    name: str
    seq: int
    count: int
    sha256: str
    bytes: int | None = None  # the file's size, where recorded


@dataclass
class Rebuilt:
    """A damaged shard rebuilt from the sources, byte-identical to the build's (sha256 checked).

    ``candidate`` is the rebuilt file, not yet in place (None in a dry run); ``members`` maps each
    sample key, in shard order, to its ``(member name, sha256)`` list (empty in a dry run)."""

    unit: Unit
    candidate: Path | None
    members: dict[str, list[tuple[str, str]]] = field(default_factory=dict)


def _no_build(folder: Path, why: str) -> FromSourceError:
    return FromSourceError(f"{folder}: {why}; --from-source needs the ledger ({LEDGER_FILE}) and the "
                           f"sources of the shardsmith build that wrote it. Run `shardsmith repair {folder}` without "
                           "--from-source to keep every intact sample instead")


def _open(folder: Path, build: BuildRef | None) -> tuple[Ledger, Recipe, WdsOutput]:
    """The build's ledger, recorded recipe and the output ``folder`` is; refuses what it cannot rebuild."""
    if build is None:
        raise _no_build(folder, "not written by a shardsmith build (no ledger in it or in a folder above it)")
    if not build.has_ledger:
        raise _no_build(folder, f"the build folder {build.root} has a manifest but no {LEDGER_FILE}")
    ledger = Ledger(build.root / LEDGER_FILE)
    try:
        recipe = recipe_from_dict(ledger.get_meta("recipe"), origin=f"{build.root} (recorded recipe)")
        output = next(o for o in recipe.outputs if o.name == build.output)
    except BaseException:
        ledger.close()
        raise
    if not isinstance(output, WdsOutput):
        ledger.close()
        raise FromSourceError(f"{folder} is output {output.name!r} (format {output.format}): --from-source rebuilds "
                              "image WebDataset shards (format wds) only. Run repair without --from-source, or "
                              "rebuild the output with the build command and --overwrite")
    return ledger, recipe, output


_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    """The sha256 of the file at ``path`` (read in 1 MiB chunks into one reused buffer)."""
    h = hashlib.sha256()
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


_sha256_file = sha256_file


def recorded_units(ledger: Ledger, output: str, split: str) -> list[Unit]:
    """The shards of ``output``/``split`` the ledger recorded as committed (a named unit), in order."""
    return [Unit(u["name"], u["seq"], u["count"], u["sha256"], u.get("bytes"))
            for u in ledger.units(output, split) if u["name"]]


MISSING, DIFFERS = "missing", "sha256 differs"


def unit_damage(folder: Path, unit: Unit, sha256: str | None = None) -> str | None:
    """How the file of ``unit`` in ``folder`` differs from the bytes the build committed: :data:`MISSING`,
    :data:`DIFFERS` (it hashes to another sha256 than ``sha256``, default the unit's; a file whose size is
    not the unit's recorded size differs without being read), or None when it holds those bytes."""
    path = folder / unit.name
    if not path.is_file():
        return MISSING
    if sha256 is None and unit.bytes is not None and path.stat().st_size != unit.bytes:
        return DIFFERS
    return DIFFERS if sha256_file(path) != (sha256 or unit.sha256) else None


def damaged_units(folder: Path, ledger: Ledger, output: str, split: str) -> list[Unit]:
    """The committed shards of ``output``/``split`` whose file is missing or differs from the ledger's sha256."""
    return [u for u in recorded_units(ledger, output, split) if unit_damage(folder, u) is not None]


def unit_items(ledger: Ledger, output: str, split: str, unit: Unit) -> list[PlannedItem]:
    """The items the build wrote into ``unit``, in plan order (the order of its samples)."""
    idxs = [idx for idx, _, _ in ledger.written(output, split, shard=unit.name)]
    if len(idxs) != unit.count:
        raise FromSourceError(f"the ledger records {len(idxs)} written item(s) for {unit.name} but {unit.count} "
                              "samples in it; it cannot say what the shard held. Run repair without --from-source")
    wanted = set(idxs)
    return [it for it in ledger.items(split=split, idx_range=(min(idxs), max(idxs) + 1)) if it.idx in wanted]


def check_source(item: PlannedItem, shard: str) -> None:
    """Refuse (naming the item) unless ``item``'s file still holds the bytes the build read."""
    head = f"cannot rebuild {shard} from its sources: item {item.item_id}"
    tail = ("; nothing was changed. Put the original file back, or run repair without --from-source "
            "to keep every intact sample")
    try:
        got = _sha256_file(Path(item.path))
    except FileNotFoundError:
        raise FromSourceError(f"{head} ({item.path}) is gone{tail}") from None
    except OSError as exc:
        raise FromSourceError(f"{head} ({item.path}) cannot be read: {exc.strerror or exc}{tail}") from None
    if item.sha256 is None or got != item.sha256:
        raise FromSourceError(f"{head} ({item.path}) changed since the build (sha256 {got[:16]}..., the build "
                              f"read {str(item.sha256)[:16]}...){tail}")


def _make_samples(maker, items: list[PlannedItem], shard: str) -> list[tuple[str, SampleResult]]:
    samples = []
    for item in items:
        res = maker(item)
        if res.status != WRITTEN:
            raise FromSourceError(f"cannot rebuild {shard}: item {item.item_id} no longer makes a sample "
                                  f"({res.status}: {res.detail}); nothing was changed")
        samples.append((item.key, res))
    return samples


def _members(samples: list[tuple[str, SampleResult]]) -> dict[str, list[tuple[str, str]]]:
    return {key: [(member_name(key, suffix), hashlib.sha256(data).hexdigest())
                  for suffix, data in s.members.items()] for key, s in samples}


def _write_checked(sink, unit: Unit, samples: list[tuple[str, SampleResult]]) -> Path:
    """Write ``unit`` with the build's sink; the file, when its sha256 is the ledger's."""
    name, _, sha = sink.write_unit(unit.seq, samples)
    path = sink.dest / name
    if name != unit.name or sha != unit.sha256:
        path.unlink(missing_ok=True)
        raise FromSourceError(f"{unit.name} rebuilt from the sources differs from the build's (sha256 {sha[:16]}..., "
                              f"the build wrote {unit.sha256[:16]}...): the installed shardsmith or image libraries "
                              "differ from the ones that built it; nothing was replaced. Run repair without "
                              "--from-source to keep every intact sample")
    return path


def rebuild_damaged(folder: Path, build: BuildRef | None, *, dry_run: bool = False) -> list[Rebuilt]:
    """Rebuild every damaged shard of ``folder`` from its sources (see module doc); all sources are
    checked before the first shard is made, and every candidate is verified before any is returned."""
    from shardsmith.sinks.wds import WdsSink
    from shardsmith.sources import open_sources
    from shardsmith.transform.samples import WdsSampleMaker

    ledger, recipe, output = _open(folder, build)
    try:
        plans = [(u, unit_items(ledger, build.output, build.split, u))
                 for u in damaged_units(folder, ledger, build.output, build.split)]
    finally:
        ledger.close()
    for unit, items in plans:
        for item in items:
            check_source(item, unit.name)
    if dry_run or not plans:
        return [Rebuilt(unit, None) for unit, _ in plans]
    maker = WdsSampleMaker(output, recipe.images, [info for info, _ in open_sources(recipe)])
    sink = WdsSink(output, build.root / STAGING / build.output / build.split)
    done: list[Rebuilt] = []
    try:
        for unit, items in plans:
            samples = _make_samples(maker, items, unit.name)
            done.append(Rebuilt(unit, _write_checked(sink, unit, samples), _members(samples)))
    except BaseException:
        for r in done:
            r.candidate.unlink(missing_ok=True)
        raise
    return done
