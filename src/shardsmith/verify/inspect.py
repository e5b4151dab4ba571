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
data; :func:`format_inspect` renders it for humans and
:func:`shardsmith.verify.empty_batches.diagnose_empty` walks FastGen's "empty / short batches"
checklist against it. Each shard is read by :func:`shardsmith.verify.shard_scan.scan_shard`; this
module adds what needs the whole folder (suspect dotted keys, keys in several shards, the count
and ignore files) and the problem lines. Memory stays bounded whatever the number of samples: no
shard's sample runs outlive its read (see :func:`scan_folder`).

A key several shards hold is judged as verify's check ``no_duplicates`` judges it
(:class:`~shardsmith.verify.folder_keys.CrossShardKeys`): the same sample under it in several shards (same
members, sizes and bytes: a shard copied beside itself) is a problem; a sample of its own in each shard (keys
numbered from 0 in every shard) is a note, since the loader keys samples by shard and key.

Nothing here writes to disk (the keys kept between the two passes are in unlinked temporary files).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from shardsmith.formats import wds as wds_layout
from shardsmith.formats.wds import IGNORE_INDEX_FILE, SHARD_COUNT_FILE, load_ignore_index, load_shard_counts
from shardsmith.verify.folder_keys import CrossShardKeys, DottedMember, FolderKeys
from shardsmith.verify.shard_scan import ShardScan, scan_shard


def scan_folder(folder: str | Path, key_map: dict[str, str] | None = None,
                progress: Any = None) -> dict[str, Any]:
    """:func:`inspect_wds`'s report, read shard by shard; ``progress``: a
    :class:`~shardsmith.progress.Progress` that shows a bar over the shards.

    Two passes keep memory bounded whatever the number of samples: the first reads each shard once
    (:func:`~shardsmith.verify.shard_scan.scan_shard`) and keeps only its report section, while its
    dotted members go to an on-disk :class:`~shardsmith.verify.folder_keys.FolderKeys` and
    its ignore-list check is done at once, and its samples (less those ``ignore_index.json`` lists for it,
    which the loader skips) go to an on-disk :class:`~shardsmith.verify.folder_keys.CrossShardKeys`, as verify
    feeds it; between the passes that tells the keys several shards hold for the same sample from the keys each
    shard uses for a sample of its own; the second, over the kept sections alone, adds what needs the whole
    folder (suspect dotted keys, keys in several shards, the count file, the problems, the notes)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"not a folder: {folder}")
    listing = wds_layout.list_shards(folder)
    shards = [folder / n for n in listing.names]
    ignore, ierr = load_ignore_index(folder)
    with FolderKeys() as keys, CrossShardKeys(folder) as cross:
        if progress is None:
            first = _first_pass(shards, key_map, ignore or {}, keys, cross, lambda: None)
        else:
            with progress.task(f"scan shards of {folder.name}", total=len(shards)) as tick:
                first = _first_pass(shards, key_map, ignore or {}, keys, cross, tick)
        cross.finish()  # reads again only the samples of the same members and sizes under one key
        return _second_pass(folder, listing.unnumbered, key_map, first, ignore, ierr, keys, cross)


@dataclass
class _FirstPass:
    """What the first pass keeps: per shard its report section (no sample runs), the dataset-wide
    count of samples having each suffix, and per shard named in the ignore list its keys that are
    in it and those that are not."""

    reports: list[dict[str, Any]] = field(default_factory=list)
    per_sample: Counter[str] = field(default_factory=Counter)
    n_samples: int = 0
    ignore_found: dict[str, tuple[list[str], list[str]]] = field(default_factory=dict)


def _first_pass(shards: list[Path], key_map: dict[str, str] | None, ignore: dict[str, list[str]],
                keys: FolderKeys, cross: CrossShardKeys, tick: Callable[[], Any]) -> _FirstPass:
    """Read each shard once; nothing per sample outlives its shard except what ``keys`` and ``cross`` hold on
    disk."""
    out = _FirstPass()
    for i, p in enumerate(shards):
        _take(out, i, scan_shard(p, key_map), ignore, keys, cross)  # the scan (its runs) goes on return
        tick()
    return out


def _take(out: _FirstPass, i: int, sc: ShardScan, ignore: dict[str, list[str]], keys: FolderKeys,
          cross: CrossShardKeys) -> None:
    """Keep what the second pass needs of shard number ``i``'s scan ``sc`` (``cross`` numbers the shards
    as they come: every shard is visited, in order)."""
    for r in sc.runs:
        out.n_samples += 1
        out.per_sample.update(set(r.suffixes))
    have = {r.key for r in sc.runs}
    keys.add_shard(i, (), (DottedMember(m.name, r.key, m.suffix)
                           for r in sc.runs for m in r.members if "." in m.suffix))
    skip = set(ignore.get(sc.path.name, ()))  # the loader skips them: not trained, so not trained twice
    cross.visit(sc.path.name, [(r.key, {m.suffix: (m.data_offset, m.size) for m in r.members})
                               for r in sc.runs if r.key not in skip])
    if sc.path.name in ignore:
        listed = ignore[sc.path.name]
        out.ignore_found[sc.path.name] = ([k for k in listed if k in have], [k for k in listed if k not in have])
    out.reports.append(sc.report)


def _second_pass(folder: Path, unnumbered: list[str], key_map: dict[str, str] | None, first: _FirstPass,
                 ignore: dict[str, list[str]] | None, ierr: str | None, keys: FolderKeys,
                 cross: CrossShardKeys) -> dict[str, Any]:
    """The whole-folder part of the report, from the first pass's sections, ``keys`` and ``cross`` (finished)."""
    reports, n_samples = first.reports, first.n_samples
    problems: list[str] = []
    notes: list[str] = []
    order_note = None
    if unnumbered:
        bad = unnumbered
        order_note = (f"non-numeric shard names ({', '.join(bad[:5])}{', ...' if len(bad) > 5 else ''}): "
                      "FastGen logs an error and sorts shards by name")
        problems.append(order_note)
    if not reports:
        problems.append(f"no *.tar shards directly in {folder} (FastGen raises ValueError)")

    # suffixes most samples have, dataset-wide: anything else with a dot is a suspect key
    known = {s for s, n in first.per_sample.items() if n * 2 > n_samples} | set((key_map or {}).values())
    multi_known = {s for s in known if "." in s}
    for i, rep in enumerate(reports):
        # every member of a run is counted in suffix_counts under its suffix, so these are the
        # counts of the members whose suffix is neither known nor dotted
        rep["minority_suffixes"] = {s: n for s, n in rep["suffix_counts"].items() if s not in known and "." not in s}
        if not any("." in s and s not in known for s in rep["suffix_counts"]):
            continue
        for d in keys.dotted(i):
            if d.suffix in known:
                continue
            parts = d.suffix.split(".")
            tail = next((".".join(parts[j:]) for j in range(1, len(parts))
                         if ".".join(parts[j:]) in known), parts[-1])
            head = d.suffix[: len(d.suffix) - len(tail) - 1]
            rep["dotted_members"].append({
                "member": d.name, "key": d.key, "suffix": d.suffix,
                "likely_key": f"{d.key}.{head}", "likely_suffix": tail,
                "why": ("suffix is not used by most samples"
                        + (" nor in key_map" if key_map else "")
                        + (f"; known multi-dot suffixes: {sorted(multi_known)}" if multi_known else "")),
            })

    names = [rep["name"] for rep in reports]

    # shard_count.json
    counts, cerr = load_shard_counts(folder)
    count_rep: dict[str, Any] = {"present": (folder / SHARD_COUNT_FILE).exists(), "error": cerr,
                                 "missing_entries": [], "extra_entries": [], "mismatches": {}}
    for rep in reports:
        name = rep["name"]
        if counts is None:
            rep["count_file"], rep["count_status"] = None, "no count file"
            continue
        rep["count_file"] = counts.get(name)
        if name not in counts:
            rep["count_status"] = "missing entry"
            count_rep["missing_entries"].append(name)
        elif counts[name] != rep["samples"]:
            rep["count_status"] = "mismatch"
            count_rep["mismatches"][name] = {"expected": counts[name], "actual": rep["samples"]}
        else:
            rep["count_status"] = "ok"
    if counts is not None:
        count_rep["extra_entries"] = sorted(set(counts) - set(names))
    if count_rep["error"]:
        problems.append(f"{count_rep['error']}; `shardsmith repair {folder}` rebuilds it")
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
    ign_rep: dict[str, Any] = {"present": (folder / IGNORE_INDEX_FILE).exists(), "error": ierr,
                               "valid": {}, "unknown_shards": [], "unknown_keys": {}}
    by_name = {rep["name"]: rep for rep in reports}
    for rep in reports:
        rep["ignored"] = []
    if ierr:
        problems.append(ierr)
    for shard in (ignore or {}):
        if shard not in by_name:
            ign_rep["unknown_shards"].append(shard)
            problems.append(f"{IGNORE_INDEX_FILE} lists {shard}, which is not a shard here (FastGen drops it with a warning)")
            continue
        ok, bad = first.ignore_found[shard]
        if ok:
            ign_rep["valid"][shard] = ok
            by_name[shard]["ignored"] = ok
        if bad:
            ign_rep["unknown_keys"][shard] = bad
            problems.append(f"{IGNORE_INDEX_FILE}: {len(bad)} key(s) for {shard} are not in it: {bad[:3]}")

    for rep in reports:
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
        for suffix, lacking in rep["missing"].items():
            sp.append(f"{n}: {len(lacking)} sample(s) lack key_map member {suffix!r} (FastGen rejects them)")
        if rep["empty_members"]:
            sp.append(f"{n}: {len(rep['empty_members'])} zero-length member(s) (dropped by an empty_keys filter)")
        if rep["samples"] == 0:
            sp.append(f"{n}: no samples")
        problems.extend(sp)
    # keys several shards hold, as verify's no_duplicates says them: the same sample under one key in several
    # shards trains once per shard that holds it; a sample of its own in each shard is trained once
    if cross.n:
        problems.append(cross.same_sample_text(folder))
    if cross.n_distinct:
        notes.append(cross.distinct_note())

    total_ignored = sum(len(v) for v in ign_rep["valid"].values())
    report = {
        "folder": str(folder),
        "key_map": dict(key_map) if key_map else None,
        "order_note": order_note,
        "shards": reports,
        "count_file": count_rep,
        "ignore_index": ign_rep,
        "keys_in_several_shards": {
            "same_sample": cross.n, "same_sample_examples": [{"key": k, "shards": w} for k, w in cross.examples],
            "distinct_samples": cross.n_distinct,
            "distinct_examples": [{"key": k, "shards": w} for k, w in cross.distinct_examples]},
        "totals": {
            "shards": len(reports),
            "members": sum(rep["members"] for rep in reports),
            "samples": n_samples,
            "ignored": total_ignored,
            "usable_samples": n_samples - total_ignored,
            "truncated_shards": sum(1 for rep in reports if rep["truncated"]),
            "damaged_headers": sum(len(rep["damaged_headers"]) for rep in reports),
            "unsafe_members": sum(len(rep["unsafe_members"]) for rep in reports),
            "corrupt_members": sum(len(rep["corrupt"]) for rep in reports),
        },
        "problems": problems,
        "notes": notes,
        "ok": not problems,
    }
    return report


def inspect_wds(folder: str | Path, key_map: dict[str, str] | None = None) -> dict[str, Any]:
    """Inspect every ``*.tar`` directly in ``folder``; return a JSON-able report.

    Top-level keys: ``folder``, ``key_map``, ``order_note``, ``shards`` (list, FastGen
    order), ``count_file``, ``ignore_index``, ``keys_in_several_shards`` (``same_sample``: how many keys
    hold the same sample in several shards, a problem; ``distinct_samples``: how many hold a sample of
    their own in each, a note; each with the first few as ``[{key, shards}]`` in ``*_examples``),
    ``totals``, ``problems`` (one line each), ``notes`` (one line each, nothing to fix) and ``ok``.
    Each shard: ``name``, ``size``, ``members``, ``suffix_counts``, ``samples``, ``missing``
    ({suffix: [keys]}), ``non_adjacent``, ``duplicate_members``, ``unkeyed_members``, ``skipped_members``,
    ``empty_members``,
    ``corrupt`` ([{member, key, suffix, error}]), ``truncated`` (None or {kind, detail,
    member, break_offset, intact_members, intact_bytes, file_size, intact_samples,
    incomplete_keys, ...}), ``damaged_headers`` ([{offset, resumed_at, name}]),
    ``unsafe_members`` ([{member, key, reason}]), ``damaged_samples`` ([{key, reason}]: what a
    rewrite would drop), ``dotted_members``, ``minority_suffixes``, ``count_file``,
    ``count_status``, ``ignored`` and ``problems``.

    For a folder a shardsmith build wrote, also ``build``: ``{"root", "unfinished"}`` (why the build is not
    finished: a build running or stopped, so the dataset is not complete, a problem) and ``integrity``
    (verify's check ``integrity``, :mod:`shardsmith.verify.integrity`: the shards against the sha256 the
    build recorded, hashed in a thread while the shards are scanned; a failure is a problem).
    """
    from shardsmith.verify.integrity import shard_integrity
    from shardsmith.verify.owning_build import BuildUnreadable, find_build, unfinished_build

    folder = Path(folder)
    if (folder / wds_layout.BUCKETS_INDEX_FILE).is_file() and not wds_layout.list_shards(folder).names:
        return _inspect_buckets(folder, key_map)
    not_done = unfinished_build(folder)
    chk = build = None
    if not_done is None:
        try:
            build = find_build(folder)
        except BuildUnreadable:
            build = None
        chk, _ = shard_integrity(folder, build)
    checked: list[dict[str, Any]] = []
    try:
        if chk is not None:
            chk.start()
        report = scan_folder(folder, key_map)
        if chk is not None:
            chk.finish(lambda name, ok, detail: checked.append({"name": name, "ok": ok, "detail": detail}))
    finally:
        if chk is not None:
            chk.close()
    if not_done is not None:
        running = f"; a build is running on it now ({not_done.running})" if not_done.running else ""
        line = (f"build not finished: {not_done.root} ({not_done.why}{running}); the shards above are those "
                f"written so far, the dataset is not complete. "
                + ("Wait for the build to finish" if not_done.running else
                   f"Finish it: re-run the same `shardsmith {not_done.command} ... --out {not_done.root}` command "
                   "(it resumes where it stopped)") + ", then inspect it again")
        report["build"] = {"root": str(not_done.root), "unfinished": line}
        report["problems"].insert(0, line)
    elif build is not None:
        report["build"] = {"root": str(build.root), "unfinished": None}
    if checked:
        report["integrity"] = checked[0]
        if not checked[0]["ok"]:
            report["problems"].append(f"integrity: {checked[0]['detail']}")
    _neg_prompt(folder, build, report)
    report["ok"] = not report["problems"]
    return report


def _neg_prompt(folder: Path, build, report: dict[str, Any]) -> None:
    """verify's check ``neg_prompt`` (:func:`shardsmith.verify.integrity.neg_prompt_check`) into the report; a
    failure is a problem."""
    from shardsmith.verify.integrity import neg_prompt_check

    neg = neg_prompt_check(folder, build)
    if neg is not None and neg[0] is not None:
        report["neg_prompt"] = {"name": "neg_prompt", "ok": neg[0], "detail": neg[1]}
        if not neg[0]:
            report["problems"].append(f"neg_prompt: {neg[1]}")


_SUMMED = ("shards", "members", "samples", "ignored", "usable_samples", "truncated_shards", "damaged_headers",
           "unsafe_members", "corrupt_members")


def _inspect_buckets(folder: Path, key_map: dict[str, str] | None) -> dict[str, Any]:
    """:func:`inspect_wds` of a multi-bucket output (one WebDataset folder per bucket beside ``buckets.json``):
    each bucket's folder inspected on its own (``buckets``: {bucket: its report}), its shards listed as
    ``<bucket folder>/NNNNN.tar`` and its problems so prefixed (a problem of the whole bucket as ``bucket B
    (DIR/): ...``); a bucket ``buckets.json`` lists whose folder is gone or holds no shard is a problem, and so
    is, for a build's output, a bucket its manifest records that ``buckets.json`` does not list (or the reverse).
    A ``buckets.json`` that cannot be used (``formats.wds.read_buckets_index``) is one problem naming it, and no
    bucket folder is read."""
    from shardsmith.verify.buckets import index_mismatch, lost_fix
    from shardsmith.verify.owning_build import BuildUnreadable, find_build

    try:
        build = find_build(folder)
    except BuildUnreadable:
        build = None
    per: dict[str, dict[str, Any]] = {}
    shards: list[dict[str, Any]] = []
    problems: list[str] = []
    notes: list[str] = []
    several: dict[str, Any] = {"same_sample": 0, "same_sample_examples": [], "distinct_samples": 0,
                               "distinct_examples": []}
    try:
        index = wds_layout.read_buckets_index(folder) or {}
    except wds_layout.BucketsIndexError as exc:  # no bucket folder is read (its dirs may lead anywhere)
        index = None
        problems.append(str(exc))
    for bucket, entry in sorted((index or {}).items()):
        if not entry["samples"]:
            continue
        d = entry["dir"]
        sub = folder / d
        if not sub.is_dir() or not wds_layout.list_shards(sub).names:
            problems.append(f"bucket {bucket} ({d}/): {entry['samples']} sample(s) in buckets.json, but "
                            + ("the folder is gone" if not sub.is_dir() else "the folder holds no .tar shard")
                            + f"; {lost_fix(folder, build)}")
            continue
        rep = per[bucket] = inspect_wds(sub, key_map)
        own = set()
        for sh in rep["shards"]:
            own.update(sh["problems"])
            shards.append({**sh, "name": f"{d}/{sh['name']}", "problems": [f"{d}/{x}" for x in sh["problems"]]})
        for x in rep["problems"]:
            if x in own:
                problems.append(f"{d}/{x}")
            elif x == rep.get("build", {}).get("unfinished"):  # the build's, said once
                problems += [] if x in problems else [x]
            else:
                problems.append(f"bucket {bucket} ({d}/): {x}")
        notes += [f"bucket {bucket} ({d}/): {x}" for x in rep["notes"]]
        # per bucket folder (a key in two buckets' shards is two samples): counts summed, the first examples kept
        for n, ex in (("same_sample", "same_sample_examples"), ("distinct_samples", "distinct_examples")):
            several[n] += rep["keys_in_several_shards"][n]
            several[ex] += [{"key": e["key"], "shards": [f"{d}/{x}" for x in e["shards"]]}
                            for e in rep["keys_in_several_shards"][ex]][:CrossShardKeys.SHOWN - len(several[ex])]
    problems += index_mismatch(folder, build, index)[1] if index is not None else []
    if not per and not problems:
        problems.append(f"no bucket of {folder / wds_layout.BUCKETS_INDEX_FILE} holds a sample")
    totals = {k: sum(r["totals"][k] for r in per.values()) for k in _SUMMED}
    report = {"folder": str(folder), "kind": "wds_buckets", "key_map": dict(key_map) if key_map else None,
              "order_note": None, "buckets": per, "shards": shards, "totals": totals,
              "keys_in_several_shards": several, "problems": problems, "notes": notes}
    _neg_prompt(folder, build, report)
    report["ok"] = not report["problems"]
    return report


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
    if report.get("notes"):
        lines.append("  notes:")
        lines.extend(f"      - {n}" for n in report["notes"])
    lines.append("OK" if report["ok"] else f"{len(report['problems'])} problem(s)")
    return "\n".join(lines)
