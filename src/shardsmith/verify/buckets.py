"""``verify`` of a multi-bucket output: each bucket's WebDataset folder is verified on its own
(its loader, ranks, workers, batch contract and accounting, and for a build's output its
``integrity`` and ``manifest`` checks against what the build recorded for that bucket), then the
bucket-aware pass is checked: every batch of one shape, and the samples a deterministic pass leaves
out because they do not fill a round of ``batch_size x world x workers`` named per bucket.

Contract: ``verify_buckets(dataset, run, build=..., **options)`` returns a report with ``kind``
``"wds_buckets"``, ``buckets`` (each bucket's own report), ``checks`` (one per bucket, ``buckets``
and ``manifest`` for a build's output, and ``bucket_rounds``) and ``ok`` (every check passed).
``run`` is the one-folder verify. A ``buckets.json`` that cannot be used (``formats.wds.read_buckets_index``:
not JSON, an entry that is damaged or whose ``dir`` is not a folder beside it) fails check ``buckets`` naming
it, and no bucket folder is read. A bucket whose folder is gone or holds no shard fails its check
(a damaged dataset, not a path mistake); for a build's output, check ``buckets`` fails on a bucket
its manifest records that ``buckets.json`` does not list (or the reverse), and check ``manifest`` on
a written count the buckets do not hold (less what repairs removed and recorded). Each bucket's count is what
its folder holds now (its loader's expected samples; ``buckets.json`` keeps the count the build wrote, which a
repair does not change), with what repairs removed said beside it; ``bucket_rounds`` counts the same.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from shardsmith.formats.wds import BucketsIndexError, read_buckets_index


def lost_fix(dataset: Path, build) -> str:
    if build is None:
        return f"restore it from a copy of {dataset}"
    from shardsmith.verify.integrity import rebuild_fix

    return rebuild_fix(build)


def _recorded_buckets(dataset: Path, build) -> dict[str, dict[str, Any]] | None:
    """The buckets the build's manifest records for this output (``{bucket: entry}``), or None."""
    if build is None or not build.has_manifest:
        return None
    from shardsmith.formats.build_dir import MANIFEST_FILE
    from shardsmith.verify.owning_build import manifest_buckets

    rel = dataset.resolve().relative_to(build.root).as_posix()
    return manifest_buckets(build.root / MANIFEST_FILE, rel)


def index_mismatch(dataset: Path, build, index: dict[str, dict[str, Any]]) -> tuple[set[str] | None, list[str]]:
    """(the buckets the build's manifest records, or None; the mismatch with ``index``, said with the fix)."""
    recorded = _recorded_buckets(dataset, build)
    if recorded is None:
        return None, []
    want = {b for b, e in recorded.items() if isinstance(e, dict) and e.get("samples")}
    have = {b for b, e in index.items() if e.get("samples")}
    lacks, extra = sorted(want - have), sorted(have - want)
    if not (lacks or extra):
        return want, []
    said = [f"the build's manifest records {len(lacks)} bucket(s) that buckets.json does not list: "
            + ", ".join(f"{b} ({recorded[b]['samples']} sample(s) in {recorded[b].get('dir', b)}/)" for b in lacks)
            if lacks else "",
            f"buckets.json lists {len(extra)} bucket(s) the build did not write: {', '.join(extra)}" if extra else ""]
    return want, ["; ".join(x for x in said if x) + "; " + lost_fix(dataset, build)]


def verify_buckets(dataset: Path, run: Callable[..., dict[str, Any]], *, world: int, workers: int,
                   batch_size: int, build=None, **options: Any) -> dict[str, Any]:
    from shardsmith.formats.detect import dataset_kind

    report = {"dataset": str(dataset), "kind": "wds_buckets", "world": world, "workers": workers,
              "batch_size": batch_size}
    try:
        index = read_buckets_index(dataset) or {}
    except BucketsIndexError as exc:  # a damaged index: no bucket folder is read (its dirs may lead anywhere)
        return {**report, "buckets": {}, "checks": [{"name": "buckets", "ok": False, "detail": str(exc)}],
                "ok": False, "notes": []}
    checks: list[dict[str, Any]] = []
    per: dict[str, dict[str, Any]] = {}
    holds: dict[str, int] = {}  # the samples each verified bucket's folder holds now (what its loader reads)
    removed = 0  # the samples repairs removed from the buckets and recorded (in each bucket's repair.json)
    for bucket, entry in sorted(index.items()):
        if not entry.get("samples"):
            continue
        folder = dataset / entry["dir"]
        try:
            dataset_kind(folder)
            gone = None
        except ValueError:
            gone = "the folder is gone" if not folder.exists() else "the folder holds no .tar shard"
        if gone is not None:
            checks.append({"name": f"bucket {bucket}", "ok": False,
                           "detail": f"{entry['samples']} sample(s) in {entry['dir']}/ (buckets.json): {gone}; "
                                     + lost_fix(dataset, build)})
            continue
        rep = run(folder, world=world, workers=workers, batch_size=batch_size, **options)
        per[bucket] = rep
        # what the folder holds now (a repair may have removed samples since buckets.json was written), else,
        # for a bucket whose verify stopped before its loader ran, what buckets.json says
        now = (rep.get("coverage") or {}).get("expected")
        holds[bucket] = int(now) if now is not None else entry["samples"]
        gone_here = int((rep.get("repairs") or {}).get("removed", 0))
        removed += gone_here
        failed = [c["name"] for c in rep["checks"] if not c["ok"]]
        checks.append({"name": f"bucket {bucket}", "ok": rep["ok"],
                       "detail": f"{holds[bucket]} sample(s)"
                                 + (f" (+{gone_here} removed by repair)" if gone_here else "")
                                 + f" in {entry['dir']}/" + (" (buckets.json)" if now is None else "") + ": "
                                 + ("every check passed" if rep["ok"] else f"failed {', '.join(failed)}")})
    held = sum(holds.values())
    want, mismatch = index_mismatch(dataset, build, index)
    if want is not None:
        checks.append({"name": "buckets", "ok": not mismatch,
                       "detail": mismatch[0] if mismatch else
                       f"the {len(want)} bucket(s) the build wrote are listed in buckets.json"})
        from shardsmith.verify.owning_build import manifest_count

        written, where = manifest_count(dataset)
        if written is not None:
            ok = written == held + removed
            checks.append({"name": "manifest", "ok": ok,
                           "detail": f"{where} says written={written}; the buckets hold {held}"
                                     + (f" + {removed} removed by repair (accounted in the buckets' repair.json)"
                                        if removed else "")
                                     + ("" if ok else "; " + lost_fix(dataset, build))})
    from shardsmith.verify.integrity import neg_prompt_check

    neg = neg_prompt_check(dataset, build)  # (beside the buckets: each bucket's loader reads it from here)
    notes = [neg[1]] if neg is not None and neg[0] is None else []
    if neg is not None and neg[0] is not None:
        checks.append({"name": "neg_prompt", "ok": neg[0], "detail": neg[1]})
    rnd = batch_size * world * max(workers, 1)
    left = {b: n % rnd for b, n in sorted(holds.items()) if n}
    never = sum(left.values())
    checks.append({"name": "bucket_rounds", "ok": True,
                   "detail": (f"{never} sample(s) per pass are never trained on at batch {batch_size} x world "
                              f"{world} x workers {max(workers, 1)} (rounds of {rnd}; per bucket: "
                              + ", ".join(f"{b} {n}" for b, n in left.items()) + ")") if never else
                             f"every bucket fills whole rounds of {rnd} samples"})
    return {**report, "buckets": per, "checks": checks,
            "ok": all(c["ok"] for c in checks) and bool(per),
            "notes": notes + ([] if per else ["no bucket holds a sample"])}
