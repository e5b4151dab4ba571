"""Repair a WebDataset folder without ever losing data silently.

* A **truncated or unreadable** shard is rewritten from its intact, complete samples (the
  sample whose member was cut is dropped and listed), with :class:`DeterministicTar`,
  atomically. The new tar is first written beside the shard, re-read and compared member by
  member (name + sha256) with what was meant to be kept; only then is the original kept as
  ``<name>.orig`` (hard link or copy; never deleted) and the new tar renamed into place.
* A shard with a **corrupt member** is not rewritten: the sample's key goes into
  ``ignore_index.json`` (merged with what is there), which FastGen's loaders honour.
* ``shard_count.json`` is rebuilt from what a loader sees per shard, **before** ignores:
  FastGen subtracts ignored keys itself (reference/fastgen.md §2.7, §8).

Non-adjacent members, duplicate members and dotted keys are reported but not changed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

from shardsmith.errors import UserError
from shardsmith.formats import IGNORE_INDEX_FILE, SHARD_COUNT_FILE
from shardsmith.sinks.atomic import atomic_open, atomic_write_json, fsync_dir
from shardsmith.sinks.tar import DeterministicTar
from shardsmith.verify.inspect import (
    ShardScan,
    _load_json,
    iter_members,
    load_ignore_index,
    scan_folder,
    scan_shard,
    skip_reason,
    split_member,
)

BACKUP_SUFFIX = ".orig"
CANDIDATE_SUFFIX = ".repaired"


class RepairError(UserError, RuntimeError):
    pass


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


def _rewrite(sc: ShardScan) -> dict[str, Any]:
    """Write the complete samples of ``sc`` to a verified candidate and swap it in."""
    path = sc.path
    keep = {(i, m[0]) for i in sc.kept for m in sc.runs[i].members}
    expected = [(m[0], m[3]) for i in sc.kept for m in sc.runs[i].members]
    cand = path.with_name(path.name + CANDIDATE_SUFFIX)
    # second streaming pass: copy members of kept samples verbatim, in their order
    state: dict[str, Any] = {}
    run_idx, cur_key = -1, None
    written: list[tuple[str, str]] = []
    with atomic_open(cand) as f:
        tar = DeterministicTar(f)
        for ti, data in iter_members(path, state):
            if skip_reason(ti.name, data):
                continue
            key, _ = split_member(ti.name)
            if key is None:
                continue
            if run_idx < 0 or key != cur_key:  # the scan's grouping rule, so indices align
                run_idx, cur_key = run_idx + 1, key
            if (run_idx, ti.name) in keep:
                tar.add(ti.name, data)
                written.append((ti.name, hashlib.sha256(data).hexdigest()))
        tar.close()
    try:
        if written != expected:
            raise RepairError(f"{path.name}: second read differs from the first; nothing replaced")
        check = scan_shard(cand)
        got = [(m[0], m[3]) for r in check.runs for m in r.members]
        if check.report["truncated"] or got != expected:
            raise RepairError(f"{path.name}: rewritten shard did not verify; nothing replaced")
    except BaseException:
        cand.unlink(missing_ok=True)
        raise
    backup = _backup_name(path)
    _keep_original(path, backup)
    os.replace(cand, path)
    fsync_dir(path.parent)
    return {"backup": backup.name, "members_written": len(written)}


def repair_wds(folder: str | Path, *, dry_run: bool = False) -> dict[str, Any]:
    """Repair ``folder`` in place (or only report with ``dry_run``); return what changed.

    Report keys: ``folder``, ``dry_run``, ``shards`` ({name: {action (rewritten |
    ignored_keys | unchanged), samples_before, samples_after, dropped_keys, ignored_keys,
    backup, notes}}), ``ignore_index`` ({path, added: {shard: [keys]}, written}),
    ``shard_count`` ({path, before, after, changed, written}), ``errors`` and ``inspect``
    (the inspect report taken before any change).
    """
    folder = Path(folder)
    before, scans = scan_folder(folder)
    errors: list[str] = []
    shards: dict[str, Any] = {}
    add_ignore: dict[str, list[str]] = {}
    already, ierr = load_ignore_index(folder)
    if ierr:
        raise RepairError(f"{ierr}; fix or move it before repairing (it is never overwritten blindly)")
    already = already or {}
    counts_after: dict[str, int] = {}

    for sc in scans:
        rep = sc.report
        name = rep["name"]
        kept_keys = [sc.runs[i].key for i in sc.kept]
        entry: dict[str, Any] = {
            "action": "unchanged",
            "samples_before": rep["samples"],
            "samples_after": rep["samples"],
            "dropped_keys": [],
            "ignored_keys": [],
            "backup": None,
            "notes": [],
        }
        if rep["truncated"]:
            t = rep["truncated"]
            entry["dropped_keys"] = [r.key for r in sc.runs if not r.complete]
            if t.get("broken_key") and t["broken_key"] not in entry["dropped_keys"] \
                    and t["broken_key"] not in kept_keys:
                entry["dropped_keys"].append(t["broken_key"])  # its first member was the one cut
            if isinstance(rep.get("count_file"), int) and rep["count_file"] > len(sc.kept):
                entry["notes"].append(
                    f"{SHARD_COUNT_FILE} said {rep['count_file']} samples: {rep['count_file'] - len(sc.kept)} "
                    "are not recoverable from this file (the original bytes stay in the backup)")
            entry["notes"].append(f"{t['kind']} at byte {t['break_offset']}: kept {len(sc.kept)} complete sample(s)")
            entry["samples_after"] = len(sc.kept)
            entry["action"] = "rewritten"
            if dry_run:
                entry["backup"] = _backup_name(sc.path).name
            else:
                try:
                    entry["backup"] = _rewrite(sc)["backup"]
                except (RepairError, OSError) as e:
                    errors.append(str(e))
                    entry.update(action="unchanged", samples_after=rep["samples"], dropped_keys=[])
                    entry["notes"].append(f"rewrite failed, shard left as it was: {e}")
        # corrupt members -> ignore their samples (only samples that stay in the shard)
        live = set(kept_keys) if entry["action"] == "rewritten" else {r.key for r in sc.runs}
        bad = []
        for c in rep["corrupt"]:
            if c["key"] in live and c["key"] not in bad:
                bad.append(c["key"])
        new = [k for k in bad if k not in already.get(name, [])]
        if new:
            add_ignore[name] = new
            entry["ignored_keys"] = new
            if entry["action"] == "unchanged":
                entry["action"] = "ignored_keys"
        already_listed = [k for k in bad if k in already.get(name, [])]
        if already_listed:
            entry["notes"].append(f"already in {IGNORE_INDEX_FILE}: {already_listed}")
        for label, items in (("non-adjacent members", rep["non_adjacent"]),
                             ("duplicate members", rep["duplicate_members"]),
                             ("dotted keys", rep["dotted_members"])):
            if items:
                entry["notes"].append(f"{len(items)} {label} reported, not changed (needs a rebuild)")
        counts_after[name] = entry["samples_after"]
        shards[name] = entry

    # ignore_index.json: merge, never drop an existing entry
    ign_path = folder / IGNORE_INDEX_FILE
    merged = {k: list(v) for k, v in already.items()}
    for shard, keys in add_ignore.items():
        merged.setdefault(shard, [])
        merged[shard].extend(k for k in keys if k not in merged[shard])
    ign_written = False
    if add_ignore and not dry_run:
        atomic_write_json(ign_path, merged)
        ign_written = True

    # shard_count.json: samples per shard as a loader sees them, before ignores
    cnt_path = folder / SHARD_COUNT_FILE
    old_counts, cerr = _load_json(cnt_path)
    if cerr or not isinstance(old_counts, (dict, type(None))):
        old_counts = None
    changed = old_counts != counts_after
    cnt_written = False
    if changed and not dry_run and scans:
        if cnt_path.exists():
            # the old file is kept beside the new one: never delete data silently
            keep = _backup_name(cnt_path)
            _keep_original(cnt_path, keep)
        atomic_write_json(cnt_path, counts_after)
        cnt_written = True

    return {
        "folder": str(folder),
        "dry_run": dry_run,
        "shards": shards,
        "ignore_index": {"path": str(ign_path), "added": add_ignore, "written": ign_written},
        "shard_count": {"path": str(cnt_path), "before": old_counts, "after": counts_after,
                        "changed": changed, "written": cnt_written},
        "errors": errors,
        "inspect": before,
    }


def format_repair(report: dict[str, Any]) -> str:
    """Human-readable rendering of :func:`repair_wds`'s report."""
    head = "dry run: nothing written" if report["dry_run"] else "repair"
    lines = [f"{head}: {report['folder']}"]
    for name, e in report["shards"].items():
        line = f"  {name:<20} {e['action']:<13} {e['samples_before']} -> {e['samples_after']} samples"
        if e["dropped_keys"]:
            line += f"; dropped {e['dropped_keys']}"
        if e["ignored_keys"]:
            line += f"; ignored {e['ignored_keys']}"
        if e["backup"]:
            line += f"; original kept as {e['backup']}"
        lines.append(line)
        lines.extend(f"      - {n}" for n in e["notes"])
    sc = report["shard_count"]
    if sc["changed"]:
        lines.append(f"  {SHARD_COUNT_FILE}: {sc['before']} -> {sc['after']}")
    if report["ignore_index"]["added"]:
        lines.append(f"  {IGNORE_INDEX_FILE}: added {report['ignore_index']['added']}")
    lines.extend(f"  ERROR {e}" for e in report["errors"])
    return "\n".join(lines)
