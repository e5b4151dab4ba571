"""Static inspection of a WebDataset folder, as FastGen's loaders would see it.

:func:`inspect_wds` reads every ``*.tar`` directly in a folder, member by member in order
(as ``webdataset`` streams it), and reports, per shard: member counts by suffix, samples
(grouped exactly like ``webdataset.tariterators.group_by_keys``: consecutive members sharing
the part of the basename before its first dot), samples missing a ``key_map`` suffix, keys
that probably contained a dot, non-adjacent members, duplicate members, truncated or
unreadable tars (how many members were intact and where it broke), corrupt members (decoded
by suffix), damaged member headers (reading resumes at the next block whose header checksum
is valid, so a bad header costs one member, not the rest of the shard), unsafe members
(``../x``, ``/abs/x``, links, device files: never extracted nor copied), and how the shard
relates to ``shard_count.json`` and ``ignore_index.json``. The report is plain JSON-able
data; :func:`format_inspect` renders it for humans and :func:`diagnose_empty` walks
FastGen's "empty / short batches" checklist against it.

Nothing here writes to disk.
"""

from __future__ import annotations

import hashlib
import tarfile
import warnings
from collections import Counter
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Iterator, NamedTuple

from shardsmith.formats import wds as wds_layout
from shardsmith.formats.tar import BLOCK, EXTENDED_TYPES, tar_header_name, tar_header_ok
from shardsmith.formats.wds import IGNORE_INDEX_FILE, SHARD_COUNT_FILE, load_ignore_index, load_shard_counts
from shardsmith.loaders import decoders
from shardsmith.loaders.slots import fastgen_validation_empty



def split_member(name: str) -> tuple[str | None, str | None]:
    """(key, suffix) by webdataset's rule, ``(None, None)`` for a member without a suffix."""
    return wds_layout.split_member(name) or (None, None)


def unsafe_reason(info: tarfile.TarInfo) -> str | None:
    """Why extracting or copying member ``info`` could touch something outside the dataset (an
    absolute name, a ``..`` component, a link, a device or fifo), or ``None`` for a safe member."""
    if info.name.startswith("/"):
        return "absolute path"
    if ".." in PurePosixPath(info.name).parts:
        return "path with '..' (outside the folder)"
    if info.issym():
        return f"symbolic link to {info.linkname}"
    if info.islnk():
        return f"hard link to {info.linkname}"
    if info.ischr() or info.isblk():
        return "device file"
    if info.isfifo():
        return "fifo"
    return None


def skip_reason(name: str, data: bytes | None) -> str | None:
    """Why webdataset's tar iterator skips a member before grouping, or ``None``."""
    if data is None:
        return "not a regular file"
    if wds_layout.is_metadata_member(name):
        return "metadata member"
    return None


# ----------------------------------------------------------------------------------------
# member decode checks


def check_member(suffix: str, data: bytes) -> str | None:
    """Decode ``data`` exactly as the loader would for ``suffix``; return the error or ``None``.

    Suffixes the loader has no decoder for (unknown kinds) are not decoded. Video members are
    decoded frame by frame without keeping the frames (a long clip would not fit in memory as
    the loader's all-frames uint8 array).
    """
    try:
        decoders.check_supported(suffix)
    except decoders.UnsupportedMemberError:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if decoders.last_ext(suffix) in decoders.VIDEO_EXTS:
                from shardsmith.loaders.video_decode import count_decodable_frames

                count_decodable_frames(data)
            else:
                decoders.decode_member(suffix, data)
    except Exception as e:  # noqa: BLE001 - every decode failure is reported, not raised
        cause = e.__cause__ or e
        msg = str(cause).splitlines()[0] if str(cause) else ""
        return f"{type(cause).__name__}: {msg}"[:300]
    return None


# ----------------------------------------------------------------------------------------
# streaming scan of one shard


class MemberRef(NamedTuple):
    """One regular member of a sample as read: its name, suffix, size, sha256 and where its data lies."""

    name: str
    suffix: str
    size: int
    sha256: str
    data_offset: int


@dataclass
class Run:
    """One sample as webdataset groups it: consecutive members with the same key. ``problems``
    says why it is not intact (a damaged, cut or unsafe member); empty for an intact sample."""

    key: str
    members: list[MemberRef] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.problems

    @property
    def suffixes(self) -> list[str]:
        return [m.suffix for m in self.members]


@dataclass(frozen=True)
class LostSample:
    """A sample a rewrite of its shard cannot keep: its key (None when nothing legible says
    whose it was) and why."""

    key: str | None
    reason: str


@dataclass
class ShardScan:
    path: Path
    report: dict[str, Any]
    runs: list[Run]
    kept: list[int]  # indices into runs of the complete samples (what repair keeps)
    lost: list[LostSample] = field(default_factory=list)  # samples of which no member is left

    @property
    def dropped(self) -> list[LostSample]:
        """Every sample a rewrite leaves out: the runs with problems, then the samples lost whole."""
        return [LostSample(r.key, "; ".join(r.problems)) for r in self.runs if r.problems] + self.lost

    @property
    def needs_rewrite(self) -> bool:
        """The file must be rewritten: it is cut, has a damaged header, or holds unsafe members."""
        rep = self.report
        return bool(rep["truncated"] or rep["damaged_headers"] or rep["unsafe_members"])


@dataclass
class Member:
    """A member read intact: its header and its data (None for a non-regular member)."""

    info: tarfile.TarInfo
    data: bytes | None


@dataclass(frozen=True)
class Damage:
    """A header tarfile could not read, at byte ``offset``. Reading resumed at ``resume`` (the next
    block whose header checksum is valid), or never (None). ``name``: the member name still legible
    in the header; ``extended``: it looks like a PAX / GNU long-name header, whose member (read at
    ``resume``) lost its real name with it."""

    offset: int
    resume: int | None
    name: str | None
    extended: bool


_SCAN_CHUNK = 1 << 20  # bytes read at a time while looking for the next header (whole blocks)


def _next_header(f, start: int) -> int | None:
    """Offset of the first block at or after ``start`` (in whole blocks) whose header checksum is valid."""
    pos = start
    f.seek(pos)
    while chunk := f.read(_SCAN_CHUNK):
        for i in range(0, len(chunk) - BLOCK + 1, BLOCK):
            if tar_header_ok(chunk[i:i + BLOCK]):
                return pos + i
        pos += len(chunk)
    return None


def _members_from(f, pos: int, state: dict[str, Any]) -> Generator[Member, None, int]:
    """The members from byte ``pos`` on, until tarfile stops; returns the offset of the header it
    stopped at. A member cut short sets ``state["error"]`` and ends the file."""
    f.seek(pos)
    try:
        tar = tarfile.TarFile(fileobj=f, mode="r")
    except tarfile.ReadError:
        return pos
    while True:
        try:
            ti = tar.next()
        except tarfile.ReadError:
            return tar.offset
        if ti is None:
            return tar.offset
        data = None
        if ti.isreg():
            try:
                data = tar.extractfile(ti).read()
                if len(data) != ti.size:
                    raise tarfile.ReadError("unexpected end of data")
            except (tarfile.ReadError, EOFError, OSError) as e:
                size = state["file_size"]
                state["error"] = {
                    "kind": "truncated member",
                    "detail": f"{type(e).__name__}: {e}",
                    "member": ti.name,
                    "member_header_offset": ti.offset,
                    "member_size": ti.size,
                    "member_bytes_available": max(0, size - ti.offset_data),
                    "break_offset": size,
                }
                return size
        state["intact_members"] += 1
        state["intact_bytes"] = tar.offset  # tarfile has moved past the member's data
        yield Member(ti, data)
        tar.members = []


def _stop_error(block: bytes, stop: int, state: dict[str, Any]) -> dict[str, Any]:
    """``state["error"]`` for a file whose bytes at ``stop`` are not a whole header block."""
    size = state["file_size"]
    if state["intact_members"] or stop:
        return {"kind": "missing end-of-archive marker",
                "detail": f"file ends {size - stop} bytes after the last intact member",
                "member": None, "break_offset": size}
    return {"kind": "unreadable header", "detail": "the file is too short to be a tar" if block else "empty file",
            "member": None, "break_offset": 0}


def iter_members(path: Path, state: dict[str, Any]) -> Iterator[Member | Damage]:
    """Stream the members of ``path`` in order, resynchronising past damaged headers.

    Yields a :class:`Member` per member read intact and a :class:`Damage` per header that could not
    be read; reading goes on at the next block whose header checksum is valid. On exit ``state``
    holds ``intact_members``, ``intact_bytes`` (end of the last intact member), ``file_size`` and
    ``error``: None, or where reading stopped for good (a member cut short, a damaged header no
    valid one follows, a file that ends without its end-of-archive marker).
    """
    size = path.stat().st_size
    state.update(intact_members=0, intact_bytes=0, file_size=size, error=None)
    with open(path, "rb") as f:
        pos = 0
        while True:
            stop = yield from _members_from(f, pos, state)
            if state["error"] is not None:
                return
            f.seek(stop)
            block = f.read(BLOCK)
            if len(block) < BLOCK:
                state["error"] = _stop_error(block, stop, state)
                return
            if not block.strip(b"\0"):
                return  # the end-of-archive marker
            resume = _next_header(f, stop + BLOCK)
            extended = not tar_header_ok(block) and block[156:157] in EXTENDED_TYPES
            yield Damage(stop, resume, tar_header_name(block), extended)
            if resume is None:
                state["error"] = {"kind": "unreadable header",
                                  "detail": "no valid tar header follows the damaged one",
                                  "member": None, "break_offset": stop}
                return
            pos = resume


@dataclass
class _Gap:
    """A member lost at byte ``offset`` (a damaged header, or a file ending without its end
    marker: ``certain=False``) between run ``prev`` and run ``next`` (indices; None: no such run)."""

    offset: int
    prev: int | None
    certain: bool
    name: str | None = None  # the lost member's legible name
    next: int | None = None

    @property
    def reason(self) -> str:
        if self.certain:
            return f"damaged tar header at byte {self.offset}"
        return f"file ends at byte {self.offset} without an end-of-archive marker"


def _attribute(gap: _Gap, runs: list[Run], usual: set[str] | None, lost: list[LostSample]) -> None:
    """Mark the sample ``gap``'s member belonged to: the run on both sides of it, else the run its
    legible name names, else the neighbours lacking a usual suffix (both when no other run tells
    what is usual and the loss is certain); a certain loss none of them shows was a whole sample."""
    named = split_member(gap.name)[0] if gap.name else None
    near = [runs[i] for i in dict.fromkeys((gap.prev, gap.next)) if i is not None]
    if gap.prev is not None and gap.prev == gap.next:
        hit = near
    elif named is not None and any(r.key == named for r in near):
        hit = [r for r in near if r.key == named]
    elif usual is None:
        hit = near if gap.certain else []
    else:
        hit = [r for r in near if not usual <= set(r.suffixes)]
    for r in hit:
        r.problems.append(gap.reason)
    if not hit and gap.certain:
        lost.append(LostSample(named, f"{gap.reason} (no member of the sample is left)"))


def _attribute_gaps(gaps: list[_Gap], runs: list[Run], lost: list[LostSample]) -> None:
    """Attribute every gap (see :func:`_attribute`); a sample is listed once, however many of its
    members were lost."""
    near = {i for g in gaps for i in (g.prev, g.next) if i is not None}
    others = [set(r.suffixes) for i, r in enumerate(runs) if i not in near and not r.problems]
    usual = set.intersection(*others) if others else None
    found: list[LostSample] = []
    for g in gaps:
        _attribute(g, runs, usual, found)
    listed = {r.key for r in runs if r.problems}
    for x in found:
        if x.key is None or x.key not in listed:
            lost.append(x)
            listed.add(x.key)


def scan_shard(path: Path, key_map: dict[str, str] | None = None) -> ShardScan:
    """Read one shard once; build its report section and its sample runs."""
    state: dict[str, Any] = {}
    suffix_counts: Counter[str] = Counter()
    runs: list[Run] = []
    finished_keys: set[str] = set()
    non_adjacent: list[dict[str, Any]] = []
    duplicates: list[str] = []
    unkeyed: list[str] = []
    skipped: list[str] = []
    corrupt: list[dict[str, str]] = []
    empty: list[str] = []
    damaged: list[dict[str, Any]] = []
    unsafe: list[dict[str, Any]] = []
    unsafe_keys: dict[str, str] = {}
    gaps: list[_Gap] = []
    waiting: list[_Gap] = []  # damaged headers whose next run is not known yet
    orphan_at: int | None = None  # offset of a member whose extended header was the damaged one
    members = 0
    for ev in iter_members(path, state):
        if isinstance(ev, Damage):
            gaps.append(_Gap(ev.offset, len(runs) - 1 if runs else None, certain=True, name=ev.name))
            waiting.append(gaps[-1])
            damaged.append({"offset": ev.offset, "resumed_at": ev.resume, "name": ev.name})
            orphan_at = ev.resume if ev.extended else None
            continue
        ti, data = ev.info, ev.data
        name = ti.name
        if orphan_at is not None and ti.offset == orphan_at:
            gaps[-1].name = name  # its own header holds only a cut name: the member went with the damage
            damaged[-1]["orphaned_member"] = name
            orphan_at = None
            continue
        key, suffix = split_member(name)
        why_unsafe = unsafe_reason(ti)
        if why_unsafe:
            unsafe.append({"member": name, "key": key, "reason": why_unsafe})
            if key is not None:
                unsafe_keys.setdefault(key, f"unsafe member {name} ({why_unsafe})")
        why = skip_reason(name, data)
        if why:
            skipped.append(f"{name} ({why})")
            continue
        members += 1
        if key is None:
            unkeyed.append(name)
            continue
        suffix = suffix.lower()
        suffix_counts[suffix] += 1
        if not runs or runs[-1].key != key:
            if runs:
                finished_keys.add(runs[-1].key)
            if key in finished_keys:
                non_adjacent.append({"key": key, "member": name, "sample_index": len(runs)})
            runs.append(Run(key))
        run = runs[-1]
        if suffix in run.suffixes:
            duplicates.append(name)
        run.members.append(MemberRef(name, suffix, len(data), hashlib.sha256(data).hexdigest(), ti.offset_data))
        for g in waiting:
            g.next = len(runs) - 1
        waiting = []
        if len(data) == 0:
            empty.append(name)
        err = check_member(suffix, data)
        if err:
            corrupt.append({"member": name, "key": key, "suffix": suffix, "error": err})

    error = state["error"]
    broken = (error or {}).get("member")
    bkey = split_member(broken)[0] if broken else None
    lost: list[LostSample] = []
    if error and broken and runs and bkey == runs[-1].key:
        runs[-1].problems.append(f"member {broken} cut short (file ends at byte {error['break_offset']})")
    elif error and broken:
        lost.append(LostSample(bkey, f"member {broken} cut short (file ends at byte {error['break_offset']}); "
                               "no member of the sample is left"))
    elif error and runs and not (gaps and gaps[-1].offset == error["break_offset"]):
        gaps.append(_Gap(error["break_offset"], len(runs) - 1, certain=False))
    _attribute_gaps(gaps, runs, lost)
    for r in runs:
        if r.key in unsafe_keys:
            r.problems.append(unsafe_keys[r.key])
    kept = [i for i, r in enumerate(runs) if r.complete]

    missing: dict[str, list[str]] = {}
    for want in (key_map or {}).values():
        lacking = [r.key for r in runs if want not in r.suffixes]
        if lacking:
            missing[want] = lacking

    rep: dict[str, Any] = {
        "name": path.name,
        "size": state["file_size"],
        "members": members,
        "suffix_counts": dict(sorted(suffix_counts.items())),
        "samples": len(runs),
        "missing": missing,
        "non_adjacent": non_adjacent,
        "duplicate_members": duplicates,
        "unkeyed_members": unkeyed,
        "skipped_members": skipped,
        "empty_members": empty,
        "corrupt": corrupt,
        "truncated": None,
        "damaged_headers": damaged,
        "unsafe_members": unsafe,
        "damaged_samples": [],
        "dotted_members": [],
        "minority_suffixes": {},
    }
    if error:
        rep["truncated"] = {
            **error,
            "intact_members": state["intact_members"],
            "intact_bytes": state["intact_bytes"],
            "file_size": state["file_size"],
            "intact_samples": len(kept),
            "incomplete_keys": [r.key for r in runs if not r.complete],
            "broken_key": bkey,
        }
    scan = ShardScan(path, rep, runs, kept, lost)
    rep["damaged_samples"] = [{"key": d.key, "reason": d.reason} for d in scan.dropped]
    return scan


# ----------------------------------------------------------------------------------------
# index files


# ----------------------------------------------------------------------------------------
# the report


def scan_folder(folder: str | Path, key_map: dict[str, str] | None = None) -> tuple[dict[str, Any], list[ShardScan]]:
    """:func:`inspect_wds` plus the per-shard scans (sample runs) that repair needs."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"not a folder: {folder}")
    listing = wds_layout.list_shards(folder)
    shards = [folder / n for n in listing.names]
    scans = [scan_shard(p, key_map) for p in shards]
    problems: list[str] = []
    order_note = None
    if listing.unnumbered:
        bad = listing.unnumbered
        order_note = (f"non-numeric shard names ({', '.join(bad[:5])}{', ...' if len(bad) > 5 else ''}): "
                      "FastGen logs an error and sorts shards by name")
        problems.append(order_note)
    if not shards:
        problems.append(f"no *.tar shards directly in {folder} (FastGen raises ValueError)")

    # suffixes most samples have, dataset-wide: anything else with a dot is a suspect key
    per_sample: Counter[str] = Counter()
    n_samples = 0
    for sc in scans:
        for r in sc.runs:
            n_samples += 1
            per_sample.update(set(r.suffixes))
    known = {s for s, n in per_sample.items() if n * 2 > n_samples} | set((key_map or {}).values())
    multi_known = {s for s in known if "." in s}
    for sc in scans:
        rep = sc.report
        minority: Counter[str] = Counter()
        for r in sc.runs:
            for name, suffix, *_ in r.members:
                if suffix in known:
                    continue
                if "." in suffix:
                    parts = suffix.split(".")
                    tail = next((".".join(parts[i:]) for i in range(1, len(parts))
                                 if ".".join(parts[i:]) in known), parts[-1])
                    head = suffix[: len(suffix) - len(tail) - 1]
                    rep["dotted_members"].append({
                        "member": name, "key": r.key, "suffix": suffix,
                        "likely_key": f"{r.key}.{head}", "likely_suffix": tail,
                        "why": ("suffix is not used by most samples"
                                + (" nor in key_map" if key_map else "")
                                + (f"; known multi-dot suffixes: {sorted(multi_known)}" if multi_known else "")),
                    })
                else:
                    minority[suffix] += 1
        rep["minority_suffixes"] = dict(sorted(minority.items()))

    # duplicate keys across shards (FastGen keys ignore lists by shard, but still suspicious)
    owner: dict[str, str] = {}
    cross: dict[str, list[str]] = {}
    for sc in scans:
        for k in {r.key for r in sc.runs}:
            if k in owner:
                cross.setdefault(k, [owner[k]]).append(sc.path.name)
            else:
                owner[k] = sc.path.name

    # shard_count.json
    counts, cerr = load_shard_counts(folder)
    count_rep: dict[str, Any] = {"present": (folder / SHARD_COUNT_FILE).exists(), "error": cerr,
                                 "missing_entries": [], "extra_entries": [], "mismatches": {}}
    names = [sc.path.name for sc in scans]
    for sc in scans:
        rep = sc.report
        if counts is None:
            rep["count_file"], rep["count_status"] = None, "no count file"
            continue
        rep["count_file"] = counts.get(sc.path.name)
        if sc.path.name not in counts:
            rep["count_status"] = "missing entry"
            count_rep["missing_entries"].append(sc.path.name)
        elif counts[sc.path.name] != rep["samples"]:
            rep["count_status"] = "mismatch"
            count_rep["mismatches"][sc.path.name] = {"expected": counts[sc.path.name], "actual": rep["samples"]}
        else:
            rep["count_status"] = "ok"
    if counts is not None:
        count_rep["extra_entries"] = sorted(set(counts) - set(names))
    if count_rep["error"]:
        problems.append(count_rep["error"])
    elif not count_rep["present"]:
        problems.append(f"no {SHARD_COUNT_FILE}: FastGen's deterministic loader cannot fast-forward on resume")
    else:
        for n in count_rep["missing_entries"]:
            problems.append(f"{SHARD_COUNT_FILE} has no entry for {n} (FastGen: KeyError on fast-forward)")
        for n in count_rep["extra_entries"]:
            problems.append(f"{SHARD_COUNT_FILE} lists {n}, which is not a shard here")
        for n, mm in count_rep["mismatches"].items():
            problems.append(f"{SHARD_COUNT_FILE} says {n} has {mm['expected']} samples; it has {mm['actual']}")

    # ignore_index.json
    ignore, ierr = load_ignore_index(folder)
    ign_rep: dict[str, Any] = {"present": (folder / IGNORE_INDEX_FILE).exists(), "error": ierr,
                               "valid": {}, "unknown_shards": [], "unknown_keys": {}}
    by_name = {sc.path.name: sc for sc in scans}
    for sc in scans:
        sc.report["ignored"] = []
    if ierr:
        problems.append(ierr)
    for shard, keys in (ignore or {}).items():
        if shard not in by_name:
            ign_rep["unknown_shards"].append(shard)
            problems.append(f"{IGNORE_INDEX_FILE} lists {shard}, which is not a shard here (FastGen drops it with a warning)")
            continue
        have = {r.key for r in by_name[shard].runs}
        ok = [k for k in keys if k in have]
        bad = [k for k in keys if k not in have]
        if ok:
            ign_rep["valid"][shard] = ok
            by_name[shard].report["ignored"] = ok
        if bad:
            ign_rep["unknown_keys"][shard] = bad
            problems.append(f"{IGNORE_INDEX_FILE}: {len(bad)} key(s) for {shard} are not in it: {bad[:3]}")

    for sc in scans:
        rep = sc.report
        sp = rep["problems"] = []
        n = rep["name"]
        if rep["truncated"]:
            t = rep["truncated"]
            sp.append(f"{n}: {t['kind']} at byte {t['break_offset']} ({t['intact_members']} members, "
                      f"{t['intact_samples']} complete samples intact)")
        for d in rep["damaged_headers"]:
            after = (f"reading resumed at byte {d['resumed_at']}" if d["resumed_at"] is not None
                     else "no valid header follows")
            sp.append(f"{n}: damaged tar header at byte {d['offset']}"
                      + (f" (member {d['name']!r})" if d["name"] else "") + f"; {after}")
        for u in rep["unsafe_members"]:
            sp.append(f"{n}: unsafe member {u['member']!r}: {u['reason']} (never extracted; repair drops it)")
        if rep["damaged_samples"]:
            named = [d["key"] or "(unnamed)" for d in rep["damaged_samples"]]
            sp.append(f"{n}: {len(named)} sample(s) not intact, a repair drops them: {', '.join(named[:10])}"
                      + (", ..." if len(named) > 10 else ""))
        for c in rep["corrupt"]:
            sp.append(f"{n}: corrupt member {c['member']}: {c['error']}")
        for na in rep["non_adjacent"]:
            sp.append(f"{n}: key {na['key']} appears again at {na['member']} after another key "
                      "(webdataset yields it as a separate sample)")
        for d in rep["duplicate_members"]:
            sp.append(f"{n}: duplicate member {d} within one sample (webdataset raises ValueError)")
        for d in rep["dotted_members"]:
            sp.append(f"{n}: member {d['member']} parses as key {d['key']!r} + suffix {d['suffix']!r}; "
                      f"the key probably was {d['likely_key']!r} (keys must not contain dots)")
        for u in rep["unkeyed_members"]:
            sp.append(f"{n}: member {u} has no suffix (webdataset skips it)")
        for suffix, keys in rep["missing"].items():
            sp.append(f"{n}: {len(keys)} sample(s) lack key_map member {suffix!r} (FastGen rejects them)")
        if rep["empty_members"]:
            sp.append(f"{n}: {len(rep['empty_members'])} zero-length member(s) (dropped by an empty_keys filter)")
        if rep["samples"] == 0:
            sp.append(f"{n}: no samples")
        problems.extend(sp)
    for k, where in sorted(cross.items()):
        problems.append(f"key {k} occurs in several shards: {where}")

    total_ignored = sum(len(v) for v in ign_rep["valid"].values())
    report = {
        "folder": str(folder),
        "key_map": dict(key_map) if key_map else None,
        "order_note": order_note,
        "shards": [sc.report for sc in scans],
        "count_file": count_rep,
        "ignore_index": ign_rep,
        "duplicate_keys_across_shards": cross,
        "totals": {
            "shards": len(scans),
            "members": sum(sc.report["members"] for sc in scans),
            "samples": n_samples,
            "ignored": total_ignored,
            "usable_samples": n_samples - total_ignored,
            "truncated_shards": sum(1 for sc in scans if sc.report["truncated"]),
            "damaged_headers": sum(len(sc.report["damaged_headers"]) for sc in scans),
            "unsafe_members": sum(len(sc.report["unsafe_members"]) for sc in scans),
            "corrupt_members": sum(len(sc.report["corrupt"]) for sc in scans),
        },
        "problems": problems,
        "ok": not problems,
    }
    return report, scans


def inspect_wds(folder: str | Path, key_map: dict[str, str] | None = None) -> dict[str, Any]:
    """Inspect every ``*.tar`` directly in ``folder``; return a JSON-able report.

    Top-level keys: ``folder``, ``key_map``, ``order_note``, ``shards`` (list, FastGen
    order), ``count_file``, ``ignore_index``, ``duplicate_keys_across_shards``, ``totals``,
    ``problems`` (one line each) and ``ok``. Each shard: ``name``, ``size``, ``members``,
    ``suffix_counts``, ``samples``, ``missing`` ({suffix: [keys]}), ``non_adjacent``,
    ``duplicate_members``, ``unkeyed_members``, ``skipped_members``, ``empty_members``,
    ``corrupt`` ([{member, key, suffix, error}]), ``truncated`` (None or {kind, detail,
    member, break_offset, intact_members, intact_bytes, file_size, intact_samples,
    incomplete_keys, ...}), ``damaged_headers`` ([{offset, resumed_at, name}]),
    ``unsafe_members`` ([{member, key, reason}]), ``damaged_samples`` ([{key, reason}]: what a
    rewrite would drop), ``dotted_members``, ``minority_suffixes``, ``count_file``,
    ``count_status``, ``ignored`` and ``problems``.
    """
    return scan_folder(folder, key_map)[0]


def format_inspect(report: dict[str, Any]) -> str:
    """Human-readable rendering of :func:`inspect_wds`'s report."""
    t = report["totals"]
    lines = [f"{report['folder']}: {t['shards']} shard(s), {t['samples']} sample(s), {t['members']} member(s)"
             + (f", {t['ignored']} ignored" if t["ignored"] else "")]
    if report.get("key_map"):
        lines.append(f"  key_map: {report['key_map']}")
    for s in report["shards"]:
        suffixes = " ".join(f"{k}:{v}" for k, v in s["suffix_counts"].items())
        status = ("TRUNCATED" if s["truncated"] else "DAMAGED" if s["damaged_headers"]
                  else "UNSAFE" if s["unsafe_members"] else "PROBLEMS" if s["problems"] else "ok")
        cnt = "" if s.get("count_file") is None else f" (count file: {s['count_file']})"
        lines.append(f"  {s['name']:<20} {s['samples']:>6} samples{cnt}  [{suffixes}]  {status}")
        for p in s["problems"]:
            lines.append(f"      - {p.split(': ', 1)[1] if p.startswith(s['name'] + ': ') else p}")
    shard_lines = {p for s in report["shards"] for p in s["problems"]}
    other = [p for p in report["problems"] if p not in shard_lines]
    if other:
        lines.append("  dataset:")
        lines.extend(f"      - {p}" for p in other)
    lines.append("OK" if report["ok"] else f"{len(report['problems'])} problem(s)")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------
# FastGen's "empty or short batches" checklist


def diagnose_empty(
    report: dict[str, Any],
    world_size: int = 1,
    workers: int = 1,
    files_map: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Walk FastGen's checklist for empty / short batches against an inspect report.

    Returns ``{"verdict": <first failing item or None>, "explanation": <one line>,
    "checks": [{"item", "status" (ok|problem|unknown), "detail"}, ...]}``. Items, in order:
    ``tar_members``, ``key_map_coverage``, ``filters``, ``partitioning``, ``files_map``.
    Relative ``files_map`` paths are resolved like FastGen: against the parent of the
    shard folder.
    """
    checks: list[dict[str, str]] = []

    def add(item: str, status: str, detail: str) -> None:
        checks.append({"item": item, "status": status, "detail": detail})

    shards = report["shards"]
    t = report["totals"]
    # 1. tar members
    if not shards:
        add("tar_members", "problem", "no *.tar shards in the folder: FastGen raises ValueError")
    elif t["samples"] == 0:
        add("tar_members", "problem", "the shards hold no samples (no member names of the form <key>.<suffix>)")
    else:
        bad = [s["name"] for s in shards if s["truncated"] or s["damaged_headers"] or s["corrupt"]
               or s["non_adjacent"] or s["duplicate_members"] or s["dotted_members"]]
        if bad:
            lost = sum(len(s["corrupt"]) for s in shards)
            add("tar_members", "problem",
                f"{len(bad)} shard(s) with truncated/damaged/corrupt/split members ({', '.join(bad[:4])}); "
                f"{lost} corrupt member(s) are dropped silently by warn_and_continue")
        elif t["usable_samples"] == 0:
            add("tar_members", "problem", "every sample is listed in ignore_index.json")
        else:
            add("tar_members", "ok", f"{t['samples']} samples in {t['shards']} readable shard(s)")
    # 2. key_map coverage
    if not report.get("key_map"):
        add("key_map_coverage", "unknown", "no key_map given: pass the loader's key_map to check member coverage")
    else:
        total = t["samples"]
        lacking = {}
        for s in shards:
            for suffix, keys in s["missing"].items():
                lacking[suffix] = lacking.get(suffix, 0) + len(keys)
        if lacking:
            worst = max(lacking, key=lacking.get)
            add("key_map_coverage", "problem",
                f"{lacking[worst]} of {total} samples lack member {worst!r} "
                f"(present suffixes: {sorted({k for s in shards for k in s['suffix_counts']})}); FastGen rejects them"
                + (" - all of them" if lacking[worst] == total else ""))
        else:
            add("key_map_coverage", "ok", f"every sample has {sorted(report['key_map'].values())}")
    # 3. filters
    empties = sum(len(s["empty_members"]) for s in shards)
    add("filters", "unknown",
        "presets_filter (score, empty_keys) runs at load time and cannot be judged statically"
        + (f"; {empties} zero-length member(s) would fail empty_keys" if empties else ""))
    # 4. shard / worker partitioning (validation mode: shard i -> rank i % world, then split_by_worker)
    world, nw = max(1, int(world_size)), max(1, int(workers))
    n = len(shards)
    empty_slots = fastgen_validation_empty(n, world, nw)
    slots = world * nw
    if n and empty_slots:
        add("partitioning", "problem",
            f"{n} shard(s) for {slots} rank-workers: {empty_slots} would be empty in validation mode "
            "(train=False; empty_check raises 'No samples found'); training (resampled) and deterministic mode "
            "are unaffected")
    elif n:
        add("partitioning", "ok", f"{n} shard(s) for {slots} rank-workers: every rank-worker gets a shard")
    else:
        add("partitioning", "problem", "no shards to partition")
    # 5. files_map
    if not files_map:
        add("files_map", "ok", "no files_map constants")
    else:
        base = Path(report["folder"]).parent
        missing = []
        for k, p in files_map.items():
            path = Path(p)
            if not path.is_absolute():
                path = base / path
            if not path.is_file():
                missing.append(f"{k} -> {path}")
        if missing:
            add("files_map", "problem",
                f"missing constant file(s): {missing}; FastGen logs 'using zero embedding' and returns None "
                "(collation then fails)")
        else:
            add("files_map", "ok", f"all {len(files_map)} constant file(s) exist")

    first = next((c for c in checks if c["status"] == "problem"), None)
    return {
        "verdict": first["item"] if first else None,
        "explanation": first["detail"] if first else
        "nothing found statically; filters and decode errors at load time remain possible",
        "checks": checks,
    }
