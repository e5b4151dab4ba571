"""``verify``: iterate the real loader in N processes (simulated ranks) x K workers each.

Contract
- In: a WebDataset folder or an EDM ZIP, a loader config (preset or key_map), world, workers,
  batch size, optional batch limit per rank.
- Out: a JSON-able report ``{"dataset", "kind", "world", "workers", "checks": [...],
  "coverage": {...}, "contract": {...}, "empty_slots": [...], "stats": {...}, "ok": bool}``.
- A dataset whose shardsmith build is not finished (its ledger does not mark it complete, or it
  has a ledger but no manifest) fails at once (check ``build_finished``): "build not finished:
  resume it with the same command".
- Checks (each ``{"name", "ok", "detail"}``): every sample seen exactly once in a full
  deterministic pass, none twice; the count equals ``shard_count.json`` (minus
  ``ignore_index.json``) and the manifest of the build that wrote it, less the samples a repair
  removed and recorded in ``repair.json`` (shown in the report's ``repairs``); no rank or worker
  left without samples; no sample dropped by the loader (missing member, filter, decode);
  each tensor key has one shape; no NaN/Inf; with ``contract_in="workers"`` (``auto``'s choice
  from 4 workers per rank on) every batch reached its rank as the worker collated it
  (``rank_batches``).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from shardsmith.formats import precomputed as precomputed_layout
from shardsmith.formats.build_dir import HOLDOUT_DIR, LEDGER_FILE, MANIFEST_FILE
from shardsmith.formats.detect import dataset_kind, enclosing_build
from shardsmith.formats.wds import REPAIR_FILE, SHARD_COUNT_FILE, load_shard_counts, read_ignore_index
from shardsmith.verify.contract import ContractRecorder, batch_signature

# where the batch contract is recorded (``verify(contract_in=)``), default first
CONTRACT_MODES = ("auto", "workers", "rank", "workers-only")
# contract_in="auto" records in the workers from this many workers per rank on
AUTO_WORKERS = 4
# contract_in="workers": the rank re-reads in full its first batch and every this-many-th after it
SPOT_CHECK_EVERY = 16




def infer_key_map(folder: Path) -> dict[str, str]:
    """Batch keys = the member suffixes of the first shard's samples (``latent.pth`` -> ``latent``)."""
    from shardsmith.loaders.shard_reader import list_shards, shard_samples

    counts: Counter = Counter()
    n = 0
    for _, members in shard_samples(folder / list_shards(folder)[0])[:64]:
        counts.update(members.keys())
        n += 1
    return {s.split(".")[0]: s for s, c in counts.items() if c == n}


# ------------------------------------------------------------------------------------ workers

class _ContractInWorker:
    """``WdsDataset.batch_hook`` for ``verify(contract_in="workers"|"workers-only")``: the worker
    folds each collated batch (constants attached as views, as the rank sees them) into a
    :class:`ContractRecorder`. ``send=True`` ("workers"): the batch still goes to the rank, with
    that record and the batch's :func:`batch_signature` attached. ``send=False``
    ("workers-only"): only the sample ids and the record go."""

    def __init__(self, constants: dict[str, Any], constant_keys: set[str], send: bool = True):
        self.constants, self.constant_keys, self.send = constants, constant_keys, send
        # a batch that is not sent is not kept: collate into the same buffers each time
        self.reuses_batch = not send

    def __call__(self, batch: dict) -> dict:
        from shardsmith.loaders.collate import attach_constant_views

        full = attach_constant_views(dict(batch), self.constants)  # the batch itself is sent without them
        rec = ContractRecorder()
        rec.add(full, self.constant_keys)
        if self.send:
            batch["__contract__"], batch["__signature__"] = rec, batch_signature(full)
            return batch
        return {"__key__": batch["__key__"], "__shard__": batch["__shard__"], "__contract__": rec}


def _same_record(a: ContractRecorder, b: ContractRecorder) -> bool:
    """Two records of one batch agree exactly (NaN examples compare equal)."""
    return json.dumps(a.to_dict(), sort_keys=True, default=str) == json.dumps(b.to_dict(), sort_keys=True, default=str)


class _Arrivals:
    """The rank's side of ``contract_in="workers"``: every batch that reaches the rank must have
    the keys, dtypes and shapes the worker recorded; the first and every ``SPOT_CHECK_EVERY``-th
    are re-read in full here and must give the worker's statistics exactly."""

    def __init__(self) -> None:
        self.batches = self.spot_checked = self.mismatched = 0
        self.mismatches: list[str] = []  # the first 20, described

    def check(self, i: int, batch: dict, worker_rec: ContractRecorder, worker_sig: dict, constants: set[str]) -> None:
        self.batches += 1
        where = f"batch {i} ({batch['__shard__'][0]}/{batch['__key__'][0]} ...)"
        sig = batch_signature(batch)
        if sig != worker_sig:
            diff = sorted(k for k in set(sig) | set(worker_sig) if sig.get(k) != worker_sig.get(k))
            self._mismatch(f"{where}: the rank got {[sig.get(k) for k in diff]} for {diff}, the worker "
                           f"collated {[worker_sig.get(k) for k in diff]}")
        elif i % SPOT_CHECK_EVERY == 0:
            self.spot_checked += 1
            mine = ContractRecorder()
            mine.add(batch, constants)
            if not _same_record(mine, worker_rec):
                self._mismatch(f"{where}: the values the rank got differ from those the worker recorded")

    def _mismatch(self, what: str) -> None:
        self.mismatched += 1
        if len(self.mismatches) < 20:
            self.mismatches.append(what)

    def to_dict(self) -> dict[str, Any]:
        return {"batches": self.batches, "spot_checked": self.spot_checked, "mismatched": self.mismatched,
                "mismatches": self.mismatches}


def _rank_main(rank: int, spec: dict[str, Any], queue) -> None:
    """One simulated rank: build the loader, iterate, send back keys, contract and stats."""
    try:
        if "fork" in mp.get_all_start_methods():
            # a spawned child defaults to spawn; a torchrun rank (what we simulate) forks its workers
            mp.set_start_method("fork", force=True)
        import torch

        # torchrun runs each rank with OMP_NUM_THREADS=1; a rank with an intra-op pool beside its
        # own busy workers spends ~8 ms per small reduction in pool barriers (0.1 ms without)
        torch.set_num_threads(1)
        rec = ContractRecorder()
        arrivals = _Arrivals()
        seen: list[str] = []
        limit = spec["batches"]
        if spec["kind"] == "wds":
            from shardsmith.loaders.wds import WdsLoader
            from shardsmith.loaders.wds_config import WdsLoaderConfig

            cfg = WdsLoaderConfig(**spec["config"], rank=rank, world_size=spec["world"])
            loader = WdsLoader(cfg)
            constants = set(cfg.files_map) | set(cfg.presets_map)  # the same value in every row
            mode = spec.get("contract_in", "rank")
            if mode != "rank":
                loader.dataset.batch_hook = _ContractInWorker(loader.constants, constants, send=mode == "workers")
            for i, batch in enumerate(loader):
                if limit is not None and i >= limit:
                    break
                seen += [f"{s}/{k}" for s, k in zip(batch["__shard__"], batch["__key__"])]
                worker_rec, worker_sig = batch.pop("__contract__", None), batch.pop("__signature__", None)
                if worker_rec is None:
                    rec.add(batch, constants)
                    continue
                if worker_sig is not None:
                    arrivals.check(i, batch, worker_rec, worker_sig, constants)
                rec.merge(worker_rec)
            stats = json.loads(json.dumps(loader.stats, default=str))
        else:
            import itertools

            from shardsmith.loaders.zip import ZipLoaderConfig

            cfg = ZipLoaderConfig(**spec["config"], rank=rank, world_size=spec["world"])
            n = spec["zip_len"]
            mine = len(range(rank, n, spec["world"]))  # one epoch: positions rank, rank+world, ... < n
            want = mine if limit is None else min(mine, limit * cfg.batch_size)
            got = 0
            for batch in itertools.islice(iter(cfg.build()), -(-want // cfg.batch_size)):
                take = min(cfg.batch_size, want - got)
                batch = {k: v[:take] for k, v in batch.items()}
                seen += [str(int(i)) for i in batch["idx"]]
                rec.add(batch)
                got += take
            stats = {"samples": got}
        queue.put({"rank": rank, "seen": seen, "contract": rec, "stats": stats, "arrivals": arrivals.to_dict()})
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails the run
        queue.put({"rank": rank, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()})


def _rank_context():
    """``fork`` where the platform has it and this process has not initialised CUDA: a rank then
    starts in milliseconds with torch already imported (a spawned one spends seconds importing
    it); each rank is still a separate process with its own loader and workers, as under
    torchrun. ``spawn`` otherwise (CUDA cannot cross a fork)."""
    import sys

    torch = sys.modules.get("torch")
    cuda_live = torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized()
    if "fork" in mp.get_all_start_methods() and not cuda_live:
        return mp.get_context("fork")
    return mp.get_context("spawn")


class _Ranks:
    """``world`` rank processes: started by the constructor, collected by :meth:`collect`,
    killed by :meth:`stop` if never collected."""

    def __init__(self, spec: dict[str, Any], world: int):
        ctx = _rank_context()
        self.queue = ctx.Queue()
        self.procs = [ctx.Process(target=_rank_main, args=(r, spec, self.queue), daemon=False)
                      for r in range(world)]
        try:
            for p in self.procs:
                p.start()
        except BaseException:
            self.stop(grace=0)
            raise

    def collect(self, timeout: float) -> list[dict[str, Any]]:
        results = []
        try:
            for _ in self.procs:
                results.append(self.queue.get(timeout=timeout))
        finally:
            self.stop()
        return sorted(results, key=lambda r: r["rank"])

    def stop(self, grace: float = 10) -> None:
        for p in self.procs:
            if p.pid is None:
                continue
            p.join(timeout=grace)
            if p.is_alive():
                p.kill()
                p.join(timeout=10)


def _run_ranks(spec: dict[str, Any], world: int, timeout: float) -> list[dict[str, Any]]:
    return _Ranks(spec, world).collect(timeout)


# ------------------------------------------------------------------------------------ expected

def _expected_wds(folder: Path) -> tuple[list[str], dict[str, int], dict[str, list[str]]]:
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


def _manifest_entry(mpath: Path, rel: str) -> tuple[str, str, int] | None:
    """(output, split, written) of the output the manifest at ``mpath`` writes to ``rel``
    (relative to the manifest's folder), or None."""
    try:
        m = json.loads(mpath.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    for name, out in m.get("outputs", {}).items():
        for split, info in out.get("files", {}).items():
            if rel in (info.get("dir"), info.get("path")):
                return name, split, out["splits"][split]["written"]
    return None


def _manifest_count(dataset: Path) -> tuple[int | None, str | None]:
    """Written count recorded by the shardsmith build that produced ``dataset``, if any."""
    for root in [dataset.parent, *dataset.parents]:
        mpath = root / MANIFEST_FILE
        if mpath.exists():
            entry = _manifest_entry(mpath, dataset.resolve().relative_to(root.resolve()).as_posix())
            if entry is None:
                return None, None
            name, split, written = entry
            return written, f"{mpath} output {name} split {split}"
    return None, None


@dataclass(frozen=True)
class BuildRef:
    """The shardsmith build folder that wrote a dataset, and which output and split the dataset is.
    ``complete``: a manifest is there and the ledger (when there is one) marks the build complete."""

    root: Path
    output: str
    split: str
    has_ledger: bool
    has_manifest: bool
    complete: bool


def _ledger_entry(root: Path, rel: str) -> tuple[str, str] | None:
    """(output, split) of the output the ledger's recorded recipe writes to ``rel``, or None."""
    from shardsmith.safety.outdir import recorded_layout
    from shardsmith.split.assign import HOLDOUT, TRAIN

    for lay in recorded_layout(root)[0]:
        target = PurePosixPath(lay.target).as_posix()
        if rel == target:
            return lay.name, TRAIN
        if rel == f"{HOLDOUT_DIR}/{target}":
            return lay.name, HOLDOUT
    return None


def find_build(dataset: str | Path) -> BuildRef | None:
    """The build that wrote ``dataset``: the nearest folder at or above it holding a ledger or a
    manifest, when that build's recorded recipe (or manifest) has an output at ``dataset``."""
    from shardsmith.plan.ledger import Ledger

    found = enclosing_build(dataset)
    if found is None:
        return None
    root, has_ledger, has_manifest = found
    rel = Path(dataset).resolve().relative_to(root).as_posix()
    if has_ledger:
        entry = _ledger_entry(root, rel)
    else:
        written = _manifest_entry(root / MANIFEST_FILE, rel)
        entry = written[:2] if written else None
    if entry is None:
        return None
    done = has_manifest and (not has_ledger or bool(Ledger.peek(root / LEDGER_FILE, "complete")[0]))
    return BuildRef(root, entry[0], entry[1], has_ledger, has_manifest, done)


def unfinished(build: BuildRef) -> str | None:
    """Why ``build`` is not finished (the message verify fails with), or None when it is."""
    from shardsmith.safety.lock import holder

    if build.complete:
        return None
    why = (f"{build.root} has a ledger ({LEDGER_FILE}) but no {MANIFEST_FILE}"
           if not build.has_manifest else f"its ledger {build.root / LEDGER_FILE} does not mark it complete")
    running = holder(build.root)
    now = f"; a build is running on it now ({running})" if running else ""
    return f"build not finished: resume it with the same command ({why}{now})"


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


def _manifest_check(dataset: Path, kind: str, expected: list[str], report: dict[str, Any], check) -> None:
    """``manifest``: the build's written count equals the samples held plus those repairs removed."""
    mcount, mwhere = _manifest_count(dataset)
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


# ------------------------------------------------------------------------------------ main

def coverage(expected: list[str], seen_per_rank: list[list[str]], full: bool) -> dict[str, Any]:
    """Pure, linear in the number of ids: ``expected`` sample ids against those each rank saw.
    Returns counts and the full ``duplicates`` / ``missing`` (only for a ``full`` pass) /
    ``unknown`` lists."""
    seen: Counter = Counter()
    for ids in seen_per_rank:
        seen.update(ids)
    expected_set = set(expected)  # once: a set per key made this quadratic (17 s at 20k samples)
    return {"expected": len(expected), "seen": sum(seen.values()), "unique": len(seen),
            "duplicates": [k for k, c in seen.items() if c > 1],
            "missing": [k for k in expected if k not in seen] if full else [],
            "unknown": [k for k in seen if k not in expected_set], "full_pass": full}


def verify(dataset: str | Path, *, preset: str | None = None, key_map: dict[str, str] | None = None,
           world: int = 2, workers: int = 2, batch_size: int | None = None, batches: int | None = None,
           image_size: int | None = None, timeout: float = 600, contract_in: str = "auto") -> dict[str, Any]:
    """``batch_size=None``: the preset's own batch size (8 without a preset).

    ``contract_in`` (WebDataset; EDM ZIPs always record in the rank), see ``CONTRACT_MODES``:
    - ``"auto"`` (default): ``"workers"`` with ``AUTO_WORKERS`` or more workers per rank, else
      ``"rank"``: with few workers they are the bottleneck and the rank's recording overlaps their
      loading; with many, one core per rank cannot keep up with them (BENCHMARKS §4: 16 cores,
      world 2 x 7 workers: "workers" 0.66x the time of "rank"; world 4 x 3: 1.10x).
    - ``"workers"``: every batch crosses from the workers to its rank process, as in
      training; the workers record the value statistics on the collated batch (in parallel),
      and the rank checks that each batch it gets has the keys, dtypes and shapes the worker
      collated, and re-reads its first batch and every ``SPOT_CHECK_EVERY``-th in full, which
      must give the worker's statistics exactly (check ``rank_batches``).
    - ``"rank"``: the rank records the contract from every value it gets (one core per rank
      passes over every byte: the slowest, BENCHMARKS §4).
    - ``"workers-only"``: the workers record it and send only sample ids and statistics: the
      same sharding, decoding and collation, without moving the tensors between processes."""
    if contract_in not in CONTRACT_MODES:
        raise ValueError(f"contract_in must be one of {', '.join(repr(m) for m in CONTRACT_MODES)}, got {contract_in!r}")
    if contract_in == "auto":
        contract_in = "workers" if workers >= AUTO_WORKERS else "rank"
    from shardsmith.loaders.presets import get_preset, preset_config

    if batch_size is None:
        batch_size = int(get_preset(preset).defaults.get("batch_size", 8)) if preset else 8
    dataset = Path(dataset).resolve()
    build = find_build(dataset)
    not_done = unfinished(build) if build is not None else None
    if not_done:
        return _unfinished_report(dataset, not_done, world, workers, batch_size, batches)
    kind = dataset_kind(dataset)
    checks: list[dict[str, Any]] = []

    def check(name: str, ok: bool, detail: str) -> None:
        checks.append({"name": name, "ok": bool(ok), "detail": detail})

    report: dict[str, Any] = {"dataset": str(dataset), "kind": kind, "world": world, "workers": workers,
                              "batch_size": batch_size, "batches_per_rank": batches,
                              "contract_in": contract_in if kind == "wds" else "rank"}
    if kind == "precomputed":
        return _verify_precomputed(dataset, report, check, checks)
    if preset is not None and get_preset(preset).kind != kind:
        raise ValueError(f"preset {preset!r} reads {get_preset(preset).kind} datasets, but {dataset} is {kind}")
    if kind == "wds":
        if preset is not None:
            cfg = preset_config(preset, dataset, batch_size=batch_size, num_workers=workers)
            if key_map:
                cfg = cfg.model_copy(update={"key_map": key_map})
        else:
            cfg = preset_config("image", dataset, key_map=key_map or infer_key_map(dataset), presets_map={},
                                image_size=image_size, batch_size=batch_size, num_workers=workers)
        # constants arrive as broadcast views: the recorder reads their first row anyway
        cfg = cfg.model_copy(update={"deterministic": True, "partial": True, "start_index": 0, "shuffle_size": 0,
                                     "constants_as_views": True})
        if image_size is not None:
            cfg = cfg.model_copy(update={"image_size": image_size})
        spec_cfg = cfg.model_dump(mode="json", exclude={"rank", "world_size"})
        report["key_map"] = cfg.key_map
        from shardsmith.loaders.shard_reader import list_shards, read_shard_counts
        from shardsmith.loaders.slots import empty_slots

        shards = list_shards(dataset)
        ignore = read_ignore_index(dataset)
        counts = read_shard_counts(dataset, shards)
        empties = empty_slots(counts, {k: v for k, v in ignore.items() if k in shards}, world, workers)
        report["empty_slots"] = [{"rank": r, "worker": w, "reason": why} for r, w, why in empties]
        spec = {"kind": "wds", "config": spec_cfg, "world": world, "batches": batches, "contract_in": contract_in}
        if any(sum(1 for e in empties if e[0] == r) == max(workers, 1) for r in range(world)):
            expected, _, _ = _expected_wds(dataset)
            check("rank_splits", False, f"a rank gets no sample at all ({empties[0][2]}); use at most "
                  f"{len(expected)} rank-workers (world x workers) or write smaller shards")
            report.update(checks=checks, ok=False, coverage={}, contract={}, stats={})
            return report
        # the expected sample list first (every shard's headers): forked ranks (0.1 s to start)
        # and their workers then find these listings in memory instead of reading them again
        expected, count_file, ignore = _expected_wds(dataset)
        ranks = _Ranks(spec, world)
    else:
        from shardsmith.loaders.zip import ZipImageDataset

        cfg = preset_config(preset or "class_zip", dataset, batch_size=batch_size, num_workers=workers,
                            shuffle=False)
        n = len(ZipImageDataset(dataset, use_labels=cfg.use_labels))
        expected, count_file = [str(i) for i in range(n)], {}
        report["empty_slots"] = [{"rank": r, "worker": None, "reason": f"{n} images for {world} ranks"}
                                 for r in range(world) if r >= n]
        spec = {"kind": "zip", "config": cfg.model_dump(mode="json", exclude={"rank", "world_size"}),
                "world": world, "batches": batches, "zip_len": n}
        ranks = _Ranks(spec, world)

    results = ranks.collect(timeout)
    errors = [r for r in results if "error" in r]
    if errors:
        check("loader_runs", False, "; ".join(f"rank {r['rank']}: {r['error']}" for r in errors))
        report.update(checks=checks, ok=False, coverage={}, contract={}, stats={},
                      traces=[r["trace"] for r in errors])
        return report
    check("loader_runs", True, f"{world} process(es) x {workers} worker(s) iterated the loader")
    if report["contract_in"] == "workers":
        arr = [r.get("arrivals") or {} for r in results]
        bad = [m for a in arr for m in a.get("mismatches", [])]
        n_bad = sum(a.get("mismatched", 0) for a in arr)
        n, spot = sum(a.get("batches", 0) for a in arr), sum(a.get("spot_checked", 0) for a in arr)
        check("rank_batches", not n_bad,
              f"{n} batches reached their rank with the keys, dtypes and shapes the workers collated; {spot} "
              "re-read in full at the rank gave the workers' statistics" if not n_bad else
              f"{n_bad} batch(es) changed between the worker and the rank: " + "; ".join(bad[:3]))

    contract = ContractRecorder()
    per_rank = []
    for r in results:
        contract.merge(r["contract"])
        per_rank.append({"rank": r["rank"], "samples": len(r["seen"]), "stats": r["stats"]})
    full = batches is None
    cov = coverage(expected, [r["seen"] for r in results], full)
    dup, missing, unknown = cov["duplicates"], cov["missing"], cov["unknown"]
    report["coverage"] = {**cov, "duplicates": dup[:20], "missing": missing[:20], "unknown": unknown[:20],
                          "per_rank": per_rank}
    check("no_duplicates", not dup, f"{len(dup)} sample(s) seen more than once" + (f", e.g. {dup[:3]}" if dup else ""))
    if full:
        check("coverage", not missing and not unknown,
              f"{cov['unique']} of {len(expected)} samples seen exactly once"
              + (f"; missing e.g. {missing[:3]}" if missing else "") + (f"; unknown {unknown[:3]}" if unknown else ""))
    if kind == "wds":
        if count_file:
            n_ignored = sum(len(set(v)) for k, v in ignore.items() if k in count_file)
            total = sum(count_file.values()) - n_ignored
            check("shard_count", total == len(expected),
                  f"shard_count.json says {sum(count_file.values())} - {n_ignored} ignored = {total}; "
                  f"the tars hold {len(expected)}")
        else:
            check("shard_count", False, f"no {SHARD_COUNT_FILE}: deterministic resume in FastGen needs it "
                  "(shardsmith repair writes it)")
        dropped: Counter = Counter()
        for r in results:
            dropped.update(r["stats"].get("dropped", {}))
        check("no_drops", not dropped, "loader dropped nothing" if not dropped else
              "loader dropped " + ", ".join(f"{n} ({why})" for why, n in dropped.items()))
    _manifest_check(dataset, kind, expected, report, check)
    check("empty_splits", not report["empty_slots"],
          "every rank-worker gets samples" if not report["empty_slots"] else
          f"{len(report['empty_slots'])} rank-worker(s) get no sample ({report['empty_slots'][0]['reason']}); "
          "use fewer ranks x workers")
    if kind == "wds":
        from shardsmith.loaders.slots import fastgen_validation_empty

        n_shards, slots = len(shards), world * max(workers, 1)
        empty_val = fastgen_validation_empty(n_shards, world, workers)
        report["fastgen_validation_empty"] = empty_val
        if empty_val:
            report.setdefault("warnings", []).append(
                f"{n_shards} shards for {slots} rank-workers: in FastGen's validation mode (train=False, split by "
                f"shard) {empty_val} rank-worker(s) get no shard and raise 'No samples found'; write at least "
                f"{slots} shards (smaller samples_per_shard) or use fewer workers there. This loader's "
                "deterministic mode (split by sample) is unaffected")
    c = contract.to_dict()
    report["contract"] = c
    from shardsmith.loaders.decoders import IMAGE_EXTS

    image_keys = {k for k, v in report.get("key_map", {}).items() if v.rsplit(".", 1)[-1] in IMAGE_EXTS}
    for key, st in c["keys"].items():
        if st.get("type") == "tensor":
            if len(st.get("shapes", {})) > 1 and key in image_keys and image_size is None:
                report.setdefault("notes", []).append(
                    f"{key}: images of {len(st['shapes'])} sizes; FastGen's image loader resizes them to input_res "
                    "(check that contract with --image-size)")
            elif len(st.get("shapes", {})) > 1:
                check(f"shape:{key}", False, f"{key} has {len(st['shapes'])} shapes {list(st['shapes'])[:4]}; "
                      "batches of more than one sample cannot be stacked (several buckets: train with batch "
                      "size 1, or write one dataset per bucket)")
            if st.get("nan") or st.get("inf"):
                check(f"finite:{key}", False, f"{key} holds {st['nan']} NaN and {st['inf']} Inf values")
    report["checks"] = checks
    report["ok"] = all(ch["ok"] for ch in checks)
    return report


def _unfinished_report(dataset: Path, why: str, world: int, workers: int, batch_size: int,
                       batches: int | None) -> dict[str, Any]:
    """The report of a dataset whose build is not finished: one failed check, no loader run."""
    try:
        kind = dataset_kind(dataset)
    except ValueError:
        kind = "unknown"
    return {"dataset": str(dataset), "kind": kind, "world": world, "workers": workers, "batch_size": batch_size,
            "batches_per_rank": batches, "contract_in": None,
            "checks": [{"name": "build_finished", "ok": False, "detail": why}],
            "coverage": {}, "contract": {}, "stats": {}, "ok": False}


def _verify_precomputed(root: Path, report: dict[str, Any], check, checks: list) -> dict[str, Any]:
    """The LTX trainer's view of a ``.precomputed/`` tree: every sub-folder pairs by relative path,
    each latent dict's grid matches its tensor, conditions carry embeddings and an int64 mask."""
    import torch

    from shardsmith.loaders.precomputed import PrecomputedDataset

    dirs = precomputed_layout.present_dirs(root)
    ds = PrecomputedDataset(root, dirs)
    report.update(world=1, workers=0, dirs=dirs)
    check("pairing", not ds.unmatched, f"{len(ds)} sample(s) present in every folder {dirs}" if not ds.unmatched else
          f"{len(ds.unmatched)} file(s) lack a partner, e.g. {ds.unmatched[0][0]} missing in {ds.unmatched[0][1]}; "
          "LTX trainers silently skip those")
    rec, bad_grid, bad_mask = ContractRecorder(), [], []
    for i in range(len(ds)):
        it = ds[i]
        flat = {}
        for d in dirs:
            for k, v in it[d].items():
                flat[f"{d}.{k}"] = v.unsqueeze(0) if torch.is_tensor(v) else [v]
        lat = it.get(precomputed_layout.LATENTS)
        if lat is not None and tuple(lat["latents"].shape[1:]) != (lat["num_frames"], lat["height"], lat["width"]):
            bad_grid.append(it["path"])
        cond = it.get(precomputed_layout.CONDITIONS)
        if cond is not None and cond["prompt_attention_mask"].dtype != torch.int64:
            bad_mask.append(it["path"])
        flat["__key__"] = [it["path"]]
        rec.add(flat)
    check("latent_grid", not bad_grid, "num_frames/height/width match every latent tensor" if not bad_grid else
          f"{len(bad_grid)} latent dict(s) whose grid disagrees with the tensor, e.g. {bad_grid[:2]}")
    check("attention_mask", not bad_mask, "prompt_attention_mask is int64 everywhere" if not bad_mask else
          f"{len(bad_mask)} condition(s) with a non-int64 mask, e.g. {bad_mask[:2]}")
    c = rec.to_dict()
    report["contract"] = c
    report["coverage"] = {"expected": len(ds) + len(ds.unmatched), "seen": len(ds), "unique": len(ds),
                          "unmatched": [r for r, _ in ds.unmatched[:20]]}
    for key, st in c["keys"].items():
        if st.get("type") == "tensor" and (st.get("nan") or st.get("inf")):
            check(f"finite:{key}", False, f"{key} holds {st['nan']} NaN and {st['inf']} Inf values")
    mcount, mwhere = _manifest_count(root)
    if mcount is not None:
        check("manifest", mcount == len(ds), f"{mwhere} says written={mcount}; the tree pairs {len(ds)}")
    report["checks"] = checks
    report["ok"] = all(ch["ok"] for ch in checks)
    return report


def format_verify(report: dict[str, Any]) -> str:
    lines = [f"verify {report['dataset']} ({report['kind']}): world {report['world']} x workers "
             f"{report['workers']}, batch {report['batch_size']}"
             + {"workers": ", contract recorded in the workers (batches sent to the ranks)",
                "workers-only": ", contract recorded in the workers (batches not sent to the ranks)"}.get(
                 report.get("contract_in"), "")]
    if report.get("key_map"):
        lines.append("  key_map: " + ", ".join(f"{k}={v}" for k, v in report["key_map"].items()))
    for ch in report["checks"]:
        lines.append(f"  [{'PASS' if ch['ok'] else 'FAIL'}] {ch['name']}: {ch['detail']}")
    c = report.get("contract") or {}
    if c.get("keys"):
        lines.append(f"batch contract ({c['batches']} batches, {c['samples']} samples; sizes {c['batch_sizes']})")
        lines.append(f"  {'key':<16} {'type':<7} {'dtype':<9} {'shape':<16} {'min':>10} {'max':>10} {'mean':>10}  notes")
        for key, st in c["keys"].items():
            shape = "x".join(map(str, st.get("shape", []))) if st.get("type") == "tensor" else ""
            if st.get("type") == "str":
                lo, hi, mean = st.get("min_len"), st.get("max_len"), None
                note = f"empty {st['empty']}; e.g. {st['examples'][:1]}"
            else:
                lo, hi, mean = st.get("min"), st.get("max"), st.get("mean")
                note = f"nan {st.get('nan', 0)} inf {st.get('inf', 0)}" if st.get("type") == "tensor" else ""
                if len(st.get("shapes", {})) > 1:
                    note += f"; {len(st['shapes'])} shapes"

            def f(x):
                return "" if x is None else (f"{x:.4g}" if isinstance(x, float) else str(x))
            lines.append(f"  {key:<16} {str(st.get('type')):<7} {str(st.get('dtype')):<9} {shape:<16} "
                         f"{f(lo):>10} {f(hi):>10} {f(mean):>10}  {note}")
    rep = report.get("repairs") or {}
    if rep.get("removed"):
        shown = ", ".join(f"{x['shard']}/{x['key'] or '?'} ({x['reason']})" for x in rep["samples"][:5])
        lines.append(f"repairs: {rep['removed']} sample(s) removed by repair, accounted in {REPAIR_FILE}: "
                     f"{shown}{', ...' if rep['removed'] > 5 else ''}")
    lines += [f"note: {n}" for n in report.get("notes", [])]
    lines += [f"warning: {w}" for w in report.get("warnings", [])]
    lines.append("OK" if report["ok"] else "FAILED")
    return "\n".join(lines)
