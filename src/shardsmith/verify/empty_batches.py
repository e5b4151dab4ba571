"""FastGen's "empty or short batches" checklist, walked against an inspect report.

:func:`diagnose_empty` reads only the report of :func:`shardsmith.verify.inspect.inspect_wds` (and,
for ``files_map``, whether the constant files exist); it writes nothing.
"""

from __future__ import annotations

from typing import Any

from shardsmith.loaders.slots import fastgen_validation_empty
from shardsmith.loaders.wds_config import fastgen_files_root, resolve_files_path


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
    Relative ``files_map`` paths are resolved like FastGen (``wds_config.fastgen_files_root``):
    against the dirname of the shard folder as written, its parent.
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
    if report.get("buckets"):  # a multi-bucket output: each bucket's folder is a dataset of its own
        empty_slots = sum(fastgen_validation_empty(len(r["shards"]), world, nw) for r in report["buckets"].values())
    slots = world * nw
    if n and empty_slots:
        add("partitioning", "problem",
            f"{n} shard(s) for {slots} rank-workers: {empty_slots} would be empty in validation mode "
            + ("(summed over the bucket folders, each split on its own) " if report.get("buckets") else "")
            + "(train=False; empty_check raises 'No samples found'); training (resampled) and deterministic mode "
            "are unaffected")
    elif n:
        add("partitioning", "ok", f"{n} shard(s) for {slots} rank-workers: every rank-worker gets a shard"
            + (" of each bucket folder" if report.get("buckets") else ""))
    else:
        add("partitioning", "problem", "no shards to partition")
    # 5. files_map
    if not files_map:
        add("files_map", "ok", "no files_map constants")
    else:
        base = fastgen_files_root(report["folder"])
        missing = []
        for k, p in files_map.items():
            path = resolve_files_path(p, base)
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
