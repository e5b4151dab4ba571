"""``scan``: probe every source without writing anything, and say what a build would meet.

``scan(recipe, batch=..., updates=...)`` streams every item of every source once (bounded
batches on a thread pool, in source order; no pixels are kept), and returns a plain,
JSON-serialisable report:

- per-source item counts and bytes, declared licences, media kinds;
- image statistics from a *full* decode of every image (so truncated or corrupt files are
  found now, not at build time): shorter-side and aspect histograms, sizes, PIL modes,
  formats and what decoding had to do (EXIF rotation, CMYK, alpha, ICC ...);
- every problem item (unreadable, corrupt, missing, bad caption ...) with its status and the
  message that names the fix; exact-duplicate groups (same sha256), as the planner makes them;
- labels and captions;
- for every output of the recipe, the estimated bytes on disk, from transforming and encoding
  a deterministic sample of usable images with the build's own sample makers;
- whether there is enough data for ``batch * updates`` samples seen in training.

Nothing is written: no ledger, no output, no temporary file.

Counting rules (they mirror the planner and the sample makers):

- an item is a *problem* when its source already flagged it (``Item.error``: missing file,
  caption not UTF-8, a path or link leading outside the source, a link loop ...), its bytes
  cannot be read, or (images) it does not decode; the source's path rules are the build's
  (:mod:`shardsmith.sources.paths`), and an item refused by them is never opened;
- ``images`` statistics cover every image that decodes, extra duplicate copies and items with
  a caption problem included (they describe the pictures that are on disk);
- sizes and aspect ratios are of the upright picture (after EXIF rotation), as the
  transform sees it;
- *usable* = a decodable image with no problem, not an extra duplicate copy (when
  ``split.dedup`` is on) and not below ``images.min_size``; ``enough_data.unique`` is the
  number of distinct usable images in the train split.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import json
import math
import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from shardsmith import formats
from shardsmith.plan.probe import read_and_hash, read_failure
from shardsmith.recipe import Recipe, WdsOutput, ZipOutput
from shardsmith.records import WRITTEN, Item, ItemError, PlannedItem, SourceInfo
from shardsmith.sinks.wds import TAR_BLOCK, sample_tar_bytes
from shardsmith.sources import media_kind, open_sources, paths
from shardsmith.split import assign
from shardsmith.transform.image import decode_image, identify
from shardsmith.transform.samples import WdsSampleMaker, ZipSampleMaker

BATCH = 256

SHORT_SIDE_BINS: tuple[tuple[str, float], ...] = (
    ("<64", 64), ("64-127", 128), ("128-255", 256), ("256-511", 512), ("512-1023", 1024),
    ("1024-2047", 2048), (">=2048", math.inf))
ASPECT_BINS: tuple[tuple[str, float], ...] = (
    ("<0.5", 0.5), ("0.5-0.75", 0.75), ("0.75-0.9", 0.9), ("0.9-1.1", 1.1), ("1.1-1.33", 1.33),
    ("1.33-1.8", 1.8), ("1.8-2.5", 2.5), (">=2.5", math.inf))

#: bytes a stored ZIP member costs beyond its data: local header (30) + central entry (46) + name twice
ZIP_MEMBER_OVERHEAD = 30 + 46 + 2 * len(formats.zip_member_name(0))
#: tar end-of-archive (2 blocks) plus, on average, half a 10 KiB record of padding per shard
TAR_SHARD_OVERHEAD = 2 * TAR_BLOCK + 10 * TAR_BLOCK

MAX_REPEAT_DEFAULT = 20.0
TINY = 1000


# --------------------------------------------------------------------------- probing


@dataclass
class _Probe:
    """What one worker thread learns about one item (no pixels)."""

    kind: str
    status: str = "ok"  # "ok" | "failed:<reason>"
    detail: str | None = None
    plan_ok: bool = False  # the planner would call it "ok" (header probe only; may still fail to decode)
    sha256: str | None = None
    size: int | None = None
    width: int | None = None  # upright, as decoded
    height: int | None = None
    mode: str | None = None
    fmt: str | None = None
    notes: tuple[str, ...] = ()


def _probe(item: Item, max_pixels: int, background: tuple[int, int, int]) -> _Probe:
    pr = _Probe(kind=media_kind(item.relpath or item.path))
    if item.error is not None and (item.error[0] in paths.NO_BYTES or not item.path):
        pr.status, pr.detail = paths.status_of(item.error[0]), item.error[1]
        return pr
    data = None
    try:
        data, pr.sha256, pr.size = read_and_hash(item.path, keep=pr.kind == "image")
    except OSError as exc:
        pr.status, pr.detail = read_failure(item, exc)
        return pr
    if data is not None:
        try:
            dec = decode_image(data, name=item.item_id, max_pixels=max_pixels, background=background)
            pr.width, pr.height = dec.image.size
            pr.mode, pr.fmt, pr.notes = dec.source_mode, dec.source_format, tuple(dec.notes)
            del dec
            pr.plan_ok = True
        except Exception as exc:  # noqa: BLE001 - any decoder crash is this item's problem
            if isinstance(exc, ItemError):
                pr.status, pr.detail = exc.status, exc.detail
            else:
                pr.status, pr.detail = "failed:decode_error", f"{item.item_id} cannot be decoded: {exc}"
            try:  # did it fail the planner's header probe too, or only the full decode?
                identify(data, name=item.item_id, max_pixels=max_pixels)
                pr.plan_ok = True
            except ItemError:
                pass
        del data
    else:
        pr.plan_ok = True
    if item.error is not None:  # the source's verdict (e.g. caption_not_utf8) wins, as in the planner
        pr.status, pr.detail, pr.plan_ok = paths.status_of(item.error[0]), item.error[1], False
    return pr


# --------------------------------------------------------------------------- helpers


def human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def _bin(value: float, bins: tuple[tuple[str, float], ...]) -> str:
    for label, upper in bins:
        if value < upper:
            return label
    return bins[-1][0]


def _median(counts: Counter) -> float | int | None:
    n = sum(counts.values())
    if n == 0:
        return None
    lo_i, hi_i = (n - 1) // 2, n // 2
    lo = hi = None
    seen = 0
    for v in sorted(counts):
        seen += counts[v]
        if lo is None and seen > lo_i:
            lo = v
        if seen > hi_i:
            hi = v
            break
    m = (lo + hi) / 2
    return int(m) if m == int(m) else m


def _stats(counts: Counter) -> dict[str, Any]:
    if not counts:
        return {"min": None, "median": None, "max": None}
    return {"min": min(counts), "median": _median(counts), "max": max(counts)}


def _u64(item_id: str) -> int:
    return int.from_bytes(hashlib.sha256(item_id.encode("utf-8")).digest()[:8], "big")


@dataclass
class _OutputAcc:
    """Per-output running state: which sources it takes, a deterministic sample, counts."""

    output: Any
    sources: set[int]
    size_sample: int
    labelled: bool = False
    heap: list = field(default_factory=list)  # (-u64, seq, PlannedItem)

    def offer(self, h: int, seq: int, planned: PlannedItem) -> None:
        if self.size_sample <= 0:
            return
        if len(self.heap) < self.size_sample:
            heapq.heappush(self.heap, (-h, seq, planned))
        elif -self.heap[0][0] > h:
            heapq.heapreplace(self.heap, (-h, seq, planned))

    def sample(self) -> list[PlannedItem]:
        return [p for _, _, p in sorted(self.heap, key=lambda t: (-t[0], t[1]))]


# --------------------------------------------------------------------------- scan


def scan(recipe: Recipe, *, batch: int | None = None, updates: int | None = None,
         max_repeat: float = MAX_REPEAT_DEFAULT, size_sample: int = 32, workers: int | None = None) -> dict:
    """Probe every source of ``recipe`` (writing nothing) and return the scan report (a plain dict)."""
    rules = recipe.images
    split = recipe.split
    count_mode = split.holdout >= 1
    n_hold = int(split.holdout) if count_mode else 0
    opened = open_sources(recipe)
    infos = [info for info, _ in opened]
    names = [s.name for s in recipe.sources]
    outs = [_OutputAcc(o, {names.index(n) for n in o.sources} if o.sources else set(range(len(names))),
                       size_sample) for o in recipe.outputs if isinstance(o, (WdsOutput, ZipOutput))]

    sources: dict[str, dict[str, Any]] = {}
    licenses: Counter = Counter()
    kinds: Counter = Counter({k: 0 for k in ("image", "video", "audio", "other")})
    short_hist: Counter = Counter({label: 0 for label, _ in SHORT_SIDE_BINS})
    aspect_hist: Counter = Counter({label: 0 for label, _ in ASPECT_BINS})
    widths: Counter = Counter()
    heights: Counter = Counter()
    modes: Counter = Counter()
    fmts: Counter = Counter()
    notes: Counter = Counter()
    decoded = below_min = 0
    problems: list[dict[str, Any]] = []
    problem_counts: Counter = Counter()
    firsts: dict[bytes, tuple[str, float]] = {}  # sha digest -> (first item id, its split u)
    groups: dict[str, list[str]] = {}  # first item id -> all ids with its bytes
    group_sha: dict[str, tuple[str, int]] = {}
    dup_items = 0
    labels: Counter = Counter()
    labels_usable: Counter = Counter()
    unlabelled_usable: Counter = Counter()  # source idx -> usable items without a label
    captions = {"with_caption": 0, "empty": 0, "without": 0}
    usable_by_source: list[Counter] = [Counter() for _ in infos]  # split -> n (dups included if kept)
    usable_copies_train = 0  # usable extra copies (dedup off) in train, to get distinct counts
    hold_heap: list[tuple[float, bool, int]] = []  # count mode: the n smallest u among firsts as (-u, usable, src)
    deferred: list[tuple[int, float]] = []  # count mode, dedup off: (src, first copy's u) of usable copies
    seq = itertools.count()

    n_threads = workers or recipe.workers or min(32, (os.cpu_count() or 4) * 2)
    pool = ThreadPoolExecutor(max_workers=n_threads)
    try:
        for info, items in opened:
            src = sources[info.name] = {
                "path": info.path, "kind": info.kind, "origin": info.origin, "license": info.license,
                "items": 0, "bytes": 0, "labels": list(info.label_names) if info.label_names else None,
            }
            it = iter(items())
            while chunk := list(itertools.islice(it, BATCH)):
                probes = pool.map(lambda x: _probe(x, rules.max_pixels, tuple(rules.background)), chunk)
                for item, pr in zip(chunk, probes):
                    src["items"] += 1
                    src["bytes"] += pr.size or 0
                    licenses[info.license or "undeclared"] += 1
                    kinds[pr.kind] += 1
                    if item.caption is None:
                        captions["without"] += 1
                    else:
                        captions["with_caption"] += 1
                        if not item.caption.strip():
                            captions["empty"] += 1
                    label_name = item.label_name if item.label_name is not None else (
                        None if item.label is None else str(item.label))
                    if label_name is not None:
                        labels[label_name] += 1
                    if item.label is not None:  # the build's ZIP is class-conditional if any item has a label
                        for acc in outs:
                            if info.index in acc.sources:
                                acc.labelled = True
                    small = False
                    if pr.width is not None:
                        decoded += 1
                        w, h = pr.width, pr.height
                        short_hist[_bin(min(w, h), SHORT_SIDE_BINS)] += 1
                        aspect_hist[_bin(w / h, ASPECT_BINS)] += 1
                        widths[w] += 1
                        heights[h] += 1
                        modes[pr.mode] += 1
                        fmts[pr.fmt or "unknown"] += 1
                        notes.update(pr.notes)
                        if min(w, h) < rules.min_size:
                            below_min += 1
                            small = True
                    # duplicates and splits exactly as the planner assigns them: over items that pass its
                    # header probe (a truncated file does; it fails later, at transform)
                    first = None
                    if pr.plan_ok:
                        u = assign.split_u(item.item_id, split.seed)
                        digest = bytes.fromhex(pr.sha256)
                        first = firsts.get(digest)
                        if first is not None:
                            dup_items += 1
                            groups.setdefault(first[0], [first[0]]).append(item.item_id)
                            group_sha[first[0]] = (pr.sha256, pr.size or 0)
                            if split.dedup:
                                continue  # skipped:duplicate, whatever its own bytes would do
                            split_u = first[1]
                        else:
                            firsts[digest] = (item.item_id, u)
                            split_u = u
                    if pr.status != "ok":
                        problems.append({"id": item.item_id, "path": item.path, "status": pr.status,
                                         "detail": pr.detail})
                        problem_counts[pr.status] += 1
                    if not pr.plan_ok:
                        continue
                    usable = pr.status == "ok" and pr.kind == "image" and not small
                    if count_mode and first is None and n_hold > 0:
                        entry = (-u, usable, info.index)
                        if len(hold_heap) < n_hold:
                            heapq.heappush(hold_heap, entry)
                        elif -hold_heap[0][0] > u:
                            heapq.heapreplace(hold_heap, entry)
                    if not usable:
                        continue
                    if label_name is not None:
                        labels_usable[label_name] += 1
                    else:
                        unlabelled_usable[info.index] += 1
                    if count_mode:
                        usable_by_source[info.index]["all"] += 1
                        if first is not None:
                            deferred.append((info.index, split_u))
                        sp = None
                    else:
                        sp = assign.split_of_u(split_u, split.holdout)
                        usable_by_source[info.index][sp] += 1
                        if first is not None and sp == assign.TRAIN:
                            usable_copies_train += 1
                    planned = None
                    h64 = _u64(item.item_id)
                    for acc in outs:
                        if info.index not in acc.sources:
                            continue
                        if planned is None:
                            planned = PlannedItem(
                                idx=next(seq), item_id=item.item_id,
                                key=formats.key_base(info.name, item.relpath, item.item_id),
                                source=info.index, path=item.path, relpath=item.relpath, caption=item.caption,
                                label=item.label, label_name=item.label_name, meta=item.meta, sha256=pr.sha256,
                                size_bytes=pr.size, kind=pr.kind, width=pr.width, height=pr.height,
                                image_format=pr.fmt, mode=pr.mode, split=sp or assign.TRAIN, plan_status="ok")
                        acc.offer(h64, planned.idx, planned)
    finally:
        pool.shutdown()

    # ---- splits of the usable images
    if count_mode:
        thr = max((-e[0] for e in hold_heap), default=-1.0) if n_hold > 0 else -1.0
        for c in usable_by_source:
            c["train"] = c.pop("all", 0)
            c["holdout"] = 0
        for neg_u, usable, s_idx in hold_heap:
            if usable:
                usable_by_source[s_idx]["holdout"] += 1
                usable_by_source[s_idx]["train"] -= 1
        for s_idx, first_u in deferred:  # kept copies follow their first copy
            if first_u <= thr:
                usable_by_source[s_idx]["holdout"] += 1
                usable_by_source[s_idx]["train"] -= 1
            else:
                usable_copies_train += 1
    usable_train = sum(c[assign.TRAIN] for c in usable_by_source)
    usable_hold = sum(c[assign.HOLDOUT] for c in usable_by_source)
    usable_all = usable_train + usable_hold
    unique = usable_train - usable_copies_train

    warnings: list[str] = []

    # ---- licences
    undeclared_srcs = [n for n, s in sources.items() if not s["license"]]
    if undeclared_srcs:
        warnings.append(f"{licenses['undeclared']} item(s) have no declared licence (source(s) "
                        f"{', '.join(undeclared_srcs)}): check the terms and set sources[].license "
                        "(or --license) before training on or sharing a dataset built from them")

    # ---- problems, duplicates, kinds, sizes
    if problems:
        by = ", ".join(f"{k} {v}" for k, v in sorted(problem_counts.items(), key=lambda kv: (-kv[1], kv[0])))
        warnings.append(f"{len(problems)} item(s) cannot be used ({by}); see problems for each file and the fix")
    if dup_items:
        what = "only the first copy is used" if split.dedup else "all copies are kept (split.dedup is off)"
        warnings.append(f"{dup_items} item(s) are exact copies of others ({len(groups)} group(s)); {what}")
    others = {k: v for k, v in kinds.items() if k != "image" and v}
    if others:
        warnings.append(f"{sum(others.values())} non-image item(s) ({', '.join(f'{k} {v}' for k, v in others.items())}):"
                        " the image outputs skip them")
    if below_min:
        warnings.append(f"{below_min} image(s) have a shorter side below images.min_size={rules.min_size} "
                        "and would be skipped:too_small")
    for label_name in sorted(set(labels) - set(labels_usable)):
        warnings.append(f"class {label_name!r} has no usable image; class-conditional loaders size labels as "
                        "max(label)+1, so fix or drop that class")

    # ---- output size estimates
    estimate: dict[str, Any] = {}
    for o in recipe.outputs:
        if not isinstance(o, (WdsOutput, ZipOutput)):  # latent sizes depend on the model and each item's bucket
            estimate[o.name] = {"format": o.format, "not_estimated": "latent sizes depend on the model: run "
                                "`shardsmith build ... --one-sample` and look at that item's files"}
    for acc in outs:
        estimate[acc.output.name] = blk = _estimate(acc, infos, recipe, usable_by_source)
        exact_no_label = False
        if isinstance(acc.output, ZipOutput) and acc.labelled:
            missing = sum(n for s, n in unlabelled_usable.items() if s in acc.sources)
            if missing:
                exact_no_label = True
                warnings.append(f"output {acc.output.name}: {missing} usable image(s) have no class label and this "
                                "ZIP is class-conditional; they would be skipped:no_label")
        sample_skips = {k: v for k, v in blk["skipped_in_sample"].items()
                        if not (exact_no_label and k == "skipped:no_label")}
        if sample_skips:
            by = ", ".join(f"{k} {v}" for k, v in sample_skips.items())
            warnings.append(f"output {acc.output.name}: {sum(sample_skips.values())} of {blk['sampled']} sampled "
                            f"image(s) would not be written ({by}); the estimate assumes the same share of all "
                            f"{blk['usable']} usable")
        elif blk["usable"] == 0:
            warnings.append(f"output {acc.output.name}: no usable image would be written")

    # ---- enough data?
    enough: dict[str, Any] = {"usable": usable_all, "holdout": usable_hold, "unique": unique,
                              "batch": batch, "updates": updates, "max_repeat": max_repeat}
    ewarn: list[str] = []
    if batch is not None and updates is not None:
        seen = batch * updates
        enough["samples_seen"] = seen
        enough["repetition"] = round(seen / unique, 1) if unique else None
        if not unique:
            ewarn.append(f"no usable training samples for {seen:,} samples seen: nothing to train on")
        elif seen / unique > max_repeat:
            ewarn.append(f"each sample would be seen ~{seen / unique:,.1f} times (> max_repeat {max_repeat:g}): "
                         "expect memorisation; add data or train shorter")
    if unique < TINY:
        ewarn.append(f"tiny dataset ({unique} unique training sample(s)): validates plumbing only, not model quality")
    enough["warnings"] = ewarn
    warnings += ewarn

    report = {
        "sources": sources,
        "items": sum(s["items"] for s in sources.values()),
        "bytes": sum(s["bytes"] for s in sources.values()),
        "licenses": dict(sorted(licenses.items())),
        "kinds": dict(kinds),
        "images": {
            "count": decoded,
            "short_side": {label: short_hist[label] for label, _ in SHORT_SIDE_BINS},
            "aspect": {label: aspect_hist[label] for label, _ in ASPECT_BINS},
            "width": _stats(widths),
            "height": _stats(heights),
            "modes": dict(modes.most_common()),
            "formats": dict(fmts.most_common()),
            "notes": dict(notes.most_common()),
            "min_size": rules.min_size,
            "below_min_size": below_min,
        },
        "problems": problems,
        "problem_counts": dict(sorted(problem_counts.items())),
        "duplicates": {
            "groups": [{"sha256": group_sha[f][0], "bytes": group_sha[f][1], "items": ids}
                       for f, ids in groups.items()],
            "duplicate_items": dup_items,
            "dedup": split.dedup,
        },
        "labels": dict(sorted(labels.items())) if labels else None,
        "labels_usable": dict(sorted(labels_usable.items())) if labels else None,
        "captions": captions,
        "usable": usable_all,
        "estimate": estimate,
        "enough_data": enough,
        "warnings": warnings,
    }
    json.dumps(report)  # fail here, not in the caller, if something is not serialisable
    return report


def sample_bytes(o: WdsOutput | ZipOutput, members: dict[str, bytes], key: str) -> int:
    """Bytes one written sample adds to output ``o`` (its tar members, or its ZIP member)."""
    if isinstance(o, WdsOutput):
        return sample_tar_bytes(members, key)
    return len(members["png"]) + ZIP_MEMBER_OVERHEAD


def output_bytes(o: WdsOutput | ZipOutput, counts: tuple[int, int], per_sample: float, *,
                 empty_splits: bool) -> float:
    """Bytes on disk of output ``o`` once it holds ``counts`` = (train, holdout) samples of
    ``per_sample`` bytes each (a tar's member bytes, or a ZIP member's data + its headers), with
    the container and index files; ``empty_splits``: a ZIP is written for a split with no image."""
    total = sum(counts) * per_sample
    if isinstance(o, WdsOutput):
        for k in counts:
            if k:
                shards = math.ceil(k / o.samples_per_shard)
                if o.max_shard_bytes:
                    shards = max(shards, math.ceil(k * per_sample / o.max_shard_bytes))
                total += shards * TAR_SHARD_OVERHEAD + 20 * (shards + 1)  # + shard_count.json
    else:
        for k in counts:
            if k or empty_splits:
                # dataset.json rows ["00000/img00000000.png", 12], plus the end-of-central-directory record
                label_bytes = (len(formats.zip_member_name(0)) + 10) * k + 20
                total += label_bytes + ZIP_MEMBER_OVERHEAD + len(formats.ZIP_LABELS_FILE) + 22
    return total


def _estimate(acc: _OutputAcc, infos: list[SourceInfo], recipe: Recipe,
              usable_by_source: list[Counter]) -> dict[str, Any]:
    """Transform + encode the output's sample with the real maker; scale to its usable count."""
    o = acc.output
    n_train = sum(usable_by_source[s][assign.TRAIN] for s in acc.sources)
    n_hold = sum(usable_by_source[s][assign.HOLDOUT] for s in acc.sources)
    usable = n_train + n_hold
    blk: dict[str, Any] = {"format": o.format,
                           "target": o.dir if isinstance(o, WdsOutput) else o.path,
                           "usable": usable, "sampled": 0, "written_in_sample": 0, "skipped_in_sample": {},
                           "samples": 0, "per_sample_bytes": 0, "bytes": 0, "human": human_bytes(0)}
    sample = acc.sample()
    if isinstance(o, WdsOutput):
        maker = WdsSampleMaker(o, recipe.images, infos)
    else:
        maker = ZipSampleMaker(o, recipe.images, infos, acc.labelled)
    sizes: list[int] = []
    skipped: Counter = Counter()
    if sample:
        with ThreadPoolExecutor(max_workers=min(len(sample), recipe.workers or os.cpu_count() or 4)) as pool:
            for it, res in zip(sample, pool.map(maker, sample)):
                if res.status == WRITTEN:
                    sizes.append(sample_bytes(o, res.members or {}, it.key))
                else:
                    skipped[res.status] += 1
                del res
    blk["sampled"] = len(sample)
    blk["written_in_sample"] = len(sizes)
    blk["skipped_in_sample"] = dict(skipped.most_common())
    if not sample:
        return blk
    frac = len(sizes) / len(sample)
    per = sum(sizes) / len(sizes) if sizes else 0.0
    est_train, est_hold = round(n_train * frac), round(n_hold * frac)
    n = est_train + est_hold
    total = output_bytes(o, (est_train, est_hold), per, empty_splits=usable > 0)
    blk.update(samples=n, per_sample_bytes=round(per), bytes=round(total), human=human_bytes(total))
    return blk


# --------------------------------------------------------------------------- text


def _bar(n: int, top: int, width: int = 30) -> str:
    if not n or not top:
        return ""
    return "#" * max(1, round(width * n / top))


def _table(rows: list[list[str]], indent: str = "  ", right: set[int] = frozenset()) -> list[str]:
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(r)]
        out.append((indent + "  ".join(cells)).rstrip())
    return out


def _hist(title: str, hist: dict[str, int]) -> list[str]:
    top = max(hist.values(), default=0)
    lab = max((len(k) for k in hist), default=0)
    num = max((len(str(v)) for v in hist.values()), default=1)
    return [f"  {title}"] + [f"    {k.ljust(lab)}  {str(v).rjust(num)}  {_bar(v, top)}".rstrip()
                             for k, v in hist.items()]


def _counts(d: dict[str, int] | None) -> str:
    return ", ".join(f"{k} {v}" for k, v in (d or {}).items()) or "-"


MAX_PROBLEM_LINES = 50


def format_scan(report: dict) -> str:
    """The scan report as plain, aligned text (sections, histogram bars with counts)."""
    L: list[str] = []
    srcs = report.get("sources", {})
    L.append(f"scan: {len(srcs)} source(s), {report.get('items', 0)} item(s), {human_bytes(report.get('bytes', 0))}; "
             f"{report.get('usable', 0)} usable image(s)")

    L += ["", "sources"]
    rows = [["name", "kind", "items", "bytes", "licence", "origin", "labels", "path"]]
    for name, s in srcs.items():
        rows.append([name, s["kind"], str(s["items"]), human_bytes(s["bytes"]), s["license"] or "UNDECLARED",
                     s["origin"] or "-", str(len(s["labels"])) if s["labels"] else "-", s["path"]])
    L += _table(rows, right={2, 3})

    L += ["", "licences"]
    L += _table([[k, str(v)] for k, v in report.get("licenses", {}).items()], right={1})
    if "undeclared" in report.get("licenses", {}):
        L.append(f"  WARNING: {report['licenses']['undeclared']} item(s) have no declared licence")

    L += ["", "media kinds"]
    L += _table([[k, str(v)] for k, v in report.get("kinds", {}).items()], right={1})

    im = report.get("images", {})
    L += ["", f"images ({im.get('count', 0)} decoded)"]
    if im.get("count"):
        L += _hist("shorter side (px)", im["short_side"])
        L += _hist("aspect ratio (w/h)", im["aspect"])
        L += _table([["", "min", "median", "max"],
                     ["width", *(str(im["width"][k]) for k in ("min", "median", "max"))],
                     ["height", *(str(im["height"][k]) for k in ("min", "median", "max"))]],
                    indent="    ", right={1, 2, 3})
        L.append(f"  modes:   {_counts(im['modes'])}")
        L.append(f"  formats: {_counts(im['formats'])}")
        L.append(f"  decode notes: {_counts(im['notes'])}")
        if im.get("min_size"):
            L.append(f"  below images.min_size={im['min_size']}: {im['below_min_size']}")

    labels = report.get("labels")
    if labels:
        usable = report.get("labels_usable") or {}
        L += ["", f"labels ({len(labels)} classes)"]
        top = max(usable.values(), default=0)
        L += _table([["class", "items", "usable", ""]] +
                    [[k, str(v), str(usable.get(k, 0)), _bar(usable.get(k, 0), top)] for k, v in labels.items()],
                    right={1, 2})

    cap = report.get("captions", {})
    L += ["", "captions",
          f"  with caption: {cap.get('with_caption', 0)} (empty: {cap.get('empty', 0)}); "
          f"without: {cap.get('without', 0)}"]

    probs = report.get("problems", [])
    L += ["", f"problems ({len(probs)})"]
    if probs:
        L += _table([[k, str(v)] for k, v in report.get("problem_counts", {}).items()], right={1})
        L.append("")
        for p in probs[:MAX_PROBLEM_LINES]:
            L.append(f"  {p['status']}  {p['id']}")
            if p.get("detail"):
                L.append(f"      {p['detail']}")
        if len(probs) > MAX_PROBLEM_LINES:
            L.append(f"  ... and {len(probs) - MAX_PROBLEM_LINES} more (see --json)")
    else:
        L.append("  none")

    dup = report.get("duplicates", {})
    groups = dup.get("groups", [])
    L += ["", f"exact duplicates ({len(groups)} group(s), {dup.get('duplicate_items', 0)} extra copies)"]
    for g in groups[:20]:
        L.append(f"  {human_bytes(g['bytes'])}  {g['sha256'][:12]}  " + ", ".join(g["items"]))
    if len(groups) > 20:
        L.append(f"  ... and {len(groups) - 20} more groups (see --json)")

    est = report.get("estimate", {})
    L += ["", "estimated output size"]
    rows = [["output", "format", "samples", "per sample", "total", "sampled"]]
    notes = []
    for name, e in est.items():
        if "not_estimated" in e:
            notes.append(f"  {name} ({e['format']}): not estimated: {e['not_estimated']}")
            continue
        rows.append([name, e["format"], str(e["samples"]), human_bytes(e["per_sample_bytes"]), e["human"],
                     f"{e['written_in_sample']}/{e['sampled']} written"])
    L += _table(rows, right={2, 3, 4}) + notes

    en = report.get("enough_data", {})
    L += ["", "enough data?",
          f"  usable {en.get('usable', 0)} = train {en.get('usable', 0) - en.get('holdout', 0)} "
          f"+ holdout {en.get('holdout', 0)}; unique training samples: {en.get('unique', 0)}"]
    if en.get("samples_seen") is not None:
        rep = en.get("repetition")
        L.append(f"  batch {en['batch']} x updates {en['updates']} = {en['samples_seen']:,} samples seen; "
                 f"repetition {'- (no unique samples)' if rep is None else f'{rep:,.1f}x'} (max_repeat {en['max_repeat']:g})")

    warns = report.get("warnings", [])
    L += ["", f"warnings ({len(warns)})"]
    L += [f"  warning: {w}" for w in warns] or ["  none"]
    return "\n".join(L)
