"""What a full pass over a dataset must yield, and the counts it must equal.

- :func:`expected_wds`: every sample id ``shard/key`` of a WebDataset folder a full pass must
  yield (less ``ignore_index.json``), as a list, with the count and ignore files; ``verify``
  itself numbers them without a list (:class:`~shardsmith.verify.expected.ExpectedWds`).
- :func:`tally`: the ranks' seen logs (``verify.seen_log``) against the expected positions:
  counts, and the first ``keep`` duplicated (in first-seen order), missing (in expected order) and
  unknown (in first-seen order) ids. Memory: one byte per expected sample up to ``WINDOW``
  (then one more pass over the logs per window), one log chunk, and the duplicated and unknown
  samples themselves; no set or list of ids.
- :func:`coverage`: the same over id lists already in memory (full lists returned).
- :func:`manifest_check`: check ``manifest``: the written count of the build that wrote the
  dataset equals the samples held plus those repairs removed and recorded in ``repair.json``
  (then listed in the report's ``repairs``).
- :func:`fastgen_partial`: the samples a FastGen loader with ``partial=False`` (its default)
  drops per rank-worker at the batch size: "N samples per pass are never trained on at batch B".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.formats.wds import REPAIR_FILE, SHARD_COUNT_FILE, load_shard_counts, read_ignore_index
from shardsmith.verify.expected import Expected, ExpectedWds
from shardsmith.verify.owning_build import manifest_count
from shardsmith.verify.seen_log import SeenList

WINDOW = 1 << 25  # expected positions counted per pass over the logs (one byte each)
KEEP = 20  # ids of each kind a report names


def expected_wds(folder: Path) -> tuple[list[str], dict[str, int], dict[str, list[str]]]:
    """All sample ids ``shard/key`` a full pass must yield, plus the count and ignore files."""
    ignore = read_ignore_index(folder)
    ids: list[str] = []
    ExpectedWds.scan(folder, ignore, on_shard=lambda shard, samples: ids.extend(f"{shard}/{k}" for k, _ in samples))
    return ids, count_file(folder), ignore


def count_file(folder: Path) -> dict[str, int]:
    """``shard_count.json`` ({} without one); a malformed one raises ``ValueError``."""
    counts, err = load_shard_counts(folder)
    if err:
        raise ValueError(f"{folder / SHARD_COUNT_FILE}: {err}")
    return counts if counts is not None else {}


def _repair_account(dataset: Path, expected: Expected, check) -> dict[str, Any]:
    """The samples repairs removed from ``dataset`` (recorded in repair.json, never restored) that a
    full pass no longer holds: ``{"removed": n, "samples": [{shard, key, reason}]}``."""
    from shardsmith.verify.repair import RepairError, repair_losses

    try:
        losses = repair_losses(dataset)
    except RepairError as exc:
        check("repair_log", False, str(exc))
        return {"removed": 0, "samples": []}
    keys: dict[str, set[str]] = {}  # only the shards a repair touched

    def held(shard: str, key: str) -> bool:
        if shard not in keys:
            i = expected.shard_index(shard) if isinstance(expected, ExpectedWds) else None
            keys[shard] = set(expected.keys(i)) if i is not None else set()
        return key in keys[shard]

    gone = [x for x in losses if x.key is None or not held(x.shard, x.key)]
    return {"removed": len(gone), "samples": [{"shard": x.shard, "key": x.key, "reason": x.reason} for x in gone]}


def manifest_check(dataset: Path, kind: str, expected: Expected, report: dict[str, Any], check) -> None:
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
    if mcount > held + removed and isinstance(expected, ExpectedWds):  # which samples, and the fix
        from shardsmith.verify.repair import unaccounted_loss

        if why := unaccounted_loss(dataset, expected):
            detail += f"; {why}"
    check("manifest", mcount == held + removed, detail)


def tally(expected: Expected, logs: list, full: bool, keep: int | None = KEEP) -> dict[str, Any]:
    """``expected`` against the seen ``logs`` (one per rank, in rank order; each has ``chunks()``
    and ``unknown()``): ``{"expected", "seen", "unique", "duplicates", "missing", "unknown"
    (the first ``keep`` ids each; all with ``keep=None``), "n_duplicates", "n_missing",
    "n_unknown", "full_pass"}``. ``missing`` only for a ``full`` pass."""
    n = len(expected)
    aliases = sorted(expected.aliases)
    first_seen: dict[int, bool] = {}
    seen = unique = n_dup = n_miss = 0
    missing: list[int] = []
    dup_parts: list[np.ndarray] = []
    for lo in range(0, max(n, 1), WINDOW):
        hi = min(n, lo + WINDOW)
        counts = np.zeros(hi - lo, np.uint8)  # 0, 1, or 2 for "more than once"
        for log in logs:
            for c in log.chunks():
                seen += len(c) if lo == 0 else 0
                p = c[(c >= lo) & (c < hi)] - lo
                if len(p):
                    u, k = np.unique(p, return_counts=True)
                    counts[u] = np.minimum(counts[u] + np.minimum(k, 2), 2)
        unique += int(np.count_nonzero(counts))
        d = np.flatnonzero(counts >= 2) + lo
        n_dup += len(d)
        dup_parts.append(d)
        here = [(a, f) for a, f in aliases if lo <= a < hi]
        first_seen.update((f, bool(counts[f - lo])) for _, f in aliases if lo <= f < hi)
        if full:
            miss = counts == 0
            for a, f in here:  # a loader seeing the id counts for its first position
                miss[a - lo] = not first_seen[f]
            idx = np.flatnonzero(miss)
            n_miss += len(idx)
            room = len(idx) if keep is None else max(0, keep - len(missing))
            missing += (idx[:room] + lo).tolist()
        del counts
    unknown_per_log = [log.unknown() for log in logs]
    unk: dict[str, int] = {}
    for ids in unknown_per_log:
        for s in ids:
            unk[s] = unk.get(s, 0) + 1
    unique += len(unk)
    n_dup += sum(1 for c in unk.values() if c > 1)
    dups = _first_duplicates(logs, unknown_per_log, np.concatenate(dup_parts), unk, n_dup, keep)
    pos_ids = iter(expected.ids([d for d in dups if isinstance(d, int)]))
    return {"expected": n, "seen": seen, "unique": unique,
            "duplicates": [next(pos_ids) if isinstance(d, int) else d for d in dups],
            "missing": expected.ids(missing),
            "unknown": list(unk) if keep is None else list(unk)[:keep],
            "n_duplicates": n_dup, "n_missing": n_miss, "n_unknown": len(unk), "full_pass": full}


def _first_duplicates(logs: list, unknown_per_log: list[list[str]], dup_pos: np.ndarray, unk: dict[str, int],
                      n_dup: int, keep: int | None) -> list[int | str]:
    """The duplicated samples (positions, or unknown ids) in the order each was first seen."""
    want = n_dup if keep is None else min(n_dup, keep)
    out: list[int | str] = []
    done: set[int | str] = set()
    if not want:
        return out
    for log, unknown in zip(logs, unknown_per_log):
        for c in log.chunks():
            hit = np.flatnonzero(np.isin(c, dup_pos) | (c < 0))
            for e in c[hit].tolist():
                x: int | str = e if e >= 0 else unknown[-1 - e]
                if x in done or (isinstance(x, str) and unk[x] < 2):
                    continue
                done.add(x)
                out.append(x)
                if len(out) >= want:
                    return out
    return out


@dataclass(frozen=True)
class _Listed:
    """Expected ids already in a list (for :func:`coverage`)."""

    listed: list[str]
    aliases: tuple[tuple[int, int], ...]

    def __len__(self) -> int:
        return len(self.listed)

    def ids(self, positions: list[int]) -> list[str]:
        return [self.listed[p] for p in positions]


def coverage(expected: list[str], seen_per_rank: list[list[str]], full: bool) -> dict[str, Any]:
    """Linear in the number of ids: ``expected`` sample ids against those each rank saw, by
    :func:`tally`, with the full ``duplicates`` / ``missing`` (only for a ``full`` pass) /
    ``unknown`` lists."""
    first: dict[str, int] = {}
    aliases = []
    for i, s in enumerate(expected):
        at = first.setdefault(s, i)
        if at != i:
            aliases.append((i, at))
    logs = [SeenList(ids, first) for ids in seen_per_rank]
    return tally(_Listed(expected, tuple(aliases)), logs, full, keep=None)


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
