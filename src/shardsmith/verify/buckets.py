"""``verify`` of a multi-bucket output: each bucket's WebDataset folder is verified on its own
(its loader, ranks, workers, batch contract and accounting), then the bucket-aware pass is
checked: every batch of one shape, and the samples a deterministic pass leaves out because they
do not fill a round of ``batch_size x world x workers`` named per bucket.

Contract: ``verify_buckets(dataset, run, **options)`` returns a report with ``kind``
``"wds_buckets"``, ``buckets`` (each bucket's own report), ``checks`` (one per bucket plus
``bucket_rounds``) and ``ok`` (every bucket's report ok). ``run`` is the one-folder verify.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from shardsmith.formats.wds import read_buckets_index


def verify_buckets(dataset: Path, run: Callable[..., dict[str, Any]], *, world: int, workers: int,
                   batch_size: int, **options: Any) -> dict[str, Any]:
    index = read_buckets_index(dataset) or {}
    checks: list[dict[str, Any]] = []
    per: dict[str, dict[str, Any]] = {}
    for bucket, entry in sorted(index.items()):
        if not entry.get("samples"):
            continue
        rep = run(dataset / entry["dir"], world=world, workers=workers, batch_size=batch_size, **options)
        per[bucket] = rep
        failed = [c["name"] for c in rep["checks"] if not c["ok"]]
        checks.append({"name": f"bucket {bucket}", "ok": rep["ok"],
                       "detail": f"{entry['samples']} sample(s) in {entry['dir']}/: "
                                 + ("every check passed" if rep["ok"] else f"failed {', '.join(failed)}")})
    rnd = batch_size * world * max(workers, 1)
    left = {b: e["samples"] % rnd for b, e in sorted(index.items()) if e.get("samples")}
    never = sum(left.values())
    checks.append({"name": "bucket_rounds", "ok": True,
                   "detail": (f"{never} sample(s) per pass are never trained on at batch {batch_size} x world "
                              f"{world} x workers {max(workers, 1)} (rounds of {rnd}; per bucket: "
                              + ", ".join(f"{b} {n}" for b, n in left.items()) + ")") if never else
                             f"every bucket fills whole rounds of {rnd} samples"})
    return {"dataset": str(dataset), "kind": "wds_buckets", "world": world, "workers": workers,
            "batch_size": batch_size, "buckets": per, "checks": checks,
            "ok": all(r["ok"] for r in per.values()) and bool(per),
            "notes": [] if per else ["no bucket holds a sample"]}
