"""One shard read once: its samples as webdataset groups them, what is wrong with each, and
its section of the inspect report.

:func:`scan_shard` streams the shard (:mod:`shardsmith.verify.tar_stream`), groups members into
runs (:class:`Run`) exactly like ``webdataset.tariterators.group_by_keys`` (consecutive members sharing
the part of the basename before its first dot), judges each member
(:mod:`shardsmith.verify.member_checks`), and attributes every member lost to a damaged header or a
cut file to the sample it belonged to (or records a :class:`LostSample` when none of that sample is
left). The :class:`ShardScan` it returns holds the report section (keys listed in
:func:`shardsmith.verify.inspect.inspect_wds`), the runs and which of them a repair keeps.
Nothing here writes to disk.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from shardsmith.verify.member_checks import check_member, skip_reason, split_member, unsafe_reason
from shardsmith.verify.tar_stream import Damage, iter_members


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
