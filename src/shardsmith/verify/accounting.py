"""What a full pass over a dataset must yield, and the counts it must equal.

- :func:`expected_wds`: every sample id ``shard/key`` of a WebDataset folder a full pass must
  yield (less ``ignore_index.json``), with the count and ignore files.
- :func:`coverage`: the ids each rank saw against those expected (duplicates, missing, unknown).
- :func:`manifest_check`: check ``manifest``: the written count of the build that wrote the
  dataset equals the samples held plus those repairs removed and recorded in ``repair.json``
  (then listed in the report's ``repairs``).
- :func:`fastgen_partial`: the samples a FastGen loader with ``partial=False`` (its default)
  drops per rank-worker at the batch size: "N samples per pass are never trained on at batch B".
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from shardsmith.formats.wds import REPAIR_FILE, SHARD_COUNT_FILE, load_shard_counts, read_ignore_index
from shardsmith.verify.owning_build import manifest_count


def expected_wds(folder: Path) -> tuple[list[str], dict[str, int], dict[str, list[str]]]:
    """All sample ids ``shard/key`` a full pass must yield, plus the count and ignore files."""
    from shardsmith.loaders.shard_reader import list_shards, shard_samples

    ignore = read_ignore_index(folder)
    ids: list[str] = []
    for shard in list_shards(folder):
        skip = set(ignore.get(shard, ()))
        ids += [f"{shard}/{k}" for k, _ in shard_samples(folder / shard) if k not in skip]
    counts, err = load_shard_counts(folder)
    if err:
        raise ValueError(f"{folder / SHARD_COUNT_FILE}: {err}")
    counts = counts if counts is not None else {}
    return ids, counts, ignore


def _repair_account(dataset: Path, expected: list[str], check) -> dict[str, Any]:
    """The samples repairs removed from ``dataset`` (recorded in repair.json, never restored) that a
    full pass no longer holds: ``{"removed": n, "samples": [{shard, key, reason}]}``."""
    from shardsmith.verify.repair import RepairError, repair_losses

    try:
        losses = repair_losses(dataset)
    except RepairError as exc:
        check("repair_log", False, str(exc))
        return {"removed": 0, "samples": []}
    held = set(expected)
    gone = [x for x in losses if x.key is None or f"{x.shard}/{x.key}" not in held]
    return {"removed": len(gone), "samples": [{"shard": x.shard, "key": x.key, "reason": x.reason} for x in gone]}


def manifest_check(dataset: Path, kind: str, expected: list[str], report: dict[str, Any], check) -> None:
    """``manifest``: the build's written count equals the samples held plus those repairs removed."""
    mcount, mwhere = manifest_count(dataset)
    if mcount is None:
        return
    acc = _repair_account(dataset, expected, check) if kind == "wds" else {"removed": 0, "samples": []}
    if acc["removed"]:
        report["repairs"] = acc
    held, removed = len(expected), acc["removed"]
    detail = f"{mwhere} says written={mcount}; dataset holds {held}"
    if removed:
        detail += f" + {removed} removed by repair (accounted in {REPAIR_FILE})"
    check("manifest", mcount == held + removed, detail)


def coverage(expected: list[str], seen_per_rank: list[list[str]], full: bool) -> dict[str, Any]:
    """Pure, linear in the number of ids: ``expected`` sample ids against those each rank saw.
    Returns counts and the full ``duplicates`` / ``missing`` (only for a ``full`` pass) /
    ``unknown`` lists."""
    seen: Counter = Counter()
    for ids in seen_per_rank:
        seen.update(ids)
    expected_set = set(expected)  # once: a set per key would make this quadratic
    return {"expected": len(expected), "seen": sum(seen.values()), "unique": len(seen),
            "duplicates": [k for k, c in seen.items() if c > 1],
            "missing": [k for k in expected if k not in seen] if full else [],
            "unknown": [k for k in seen if k not in expected_set], "full_pass": full}


def fastgen_partial(n_samples: int, world: int, workers: int, batch_size: int) -> dict[str, Any]:
    """What FastGen v0.1.0's deterministic loader with ``partial=False`` drops in one pass
    (``loaders.slots.fastgen_partial_drops``): ``{"batch_size", "dropped", "trained",
    "per_rank_worker": [{"rank", "worker", "samples", "dropped"}], "line"}``; ``line`` is the
    sentence verify shows (empty when nothing is dropped)."""
    from shardsmith.loaders.slots import fastgen_partial_drops

    per = fastgen_partial_drops(n_samples, world, workers, batch_size)
    dropped = sum(d for _, d in per.values())
    rows = [{"rank": r, "worker": w, "samples": n, "dropped": d} for (r, w), (n, d) in sorted(per.items())]
    line = ""
    if dropped:
        who = ", ".join(f"r{x['rank']}w{x['worker']} {x['dropped']} of {x['samples']}" for x in rows if x["dropped"])
        line = (f"{dropped} samples per pass are never trained on at batch {batch_size}: FastGen (partial=False) "
                f"trains on {n_samples - dropped} of {n_samples}, dropping each rank-worker's last incomplete batch "
                f"({who}); use a sample count that is a multiple of batch x world x workers "
                f"({batch_size * max(world, 1) * max(workers, 1)}) or partial=True")
    return {"batch_size": batch_size, "dropped": dropped, "trained": n_samples - dropped, "per_rank_worker": rows,
            "line": line}
