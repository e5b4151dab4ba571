"""``verify``: iterate the real loader in N processes (simulated ranks) x K workers each.

Contract
- In: a WebDataset folder or an EDM ZIP, a loader config (preset or key_map), world, workers,
  batch size, optional batch limit per rank.
- Out: a JSON-able report ``{"dataset", "kind", "world", "workers", "checks": [...],
  "coverage": {...}, "contract": {...}, "empty_slots": [...], "stats": {...}, "ok": bool}``.
- A dataset whose shardsmith build is not finished (its ledger does not mark it complete, or it
  has a ledger but no manifest) fails at once (check ``build_finished``): "build not finished:
  resume it with the same command".
- The report of a dataset a finished shardsmith build wrote is also kept in that build, as
  ``.shardsmith/verify/<dataset>.json`` (``verify/record.py``), for ``shardsmith report``.
- Checks (each ``{"name", "ok", "detail"}``): every sample seen exactly once in a full
  deterministic pass, none twice; the count equals ``shard_count.json`` (minus
  ``ignore_index.json``) and the manifest of the build that wrote it, less the samples a repair
  removed and recorded in ``repair.json`` (shown in the report's ``repairs``); no rank or worker
  left without samples; no sample dropped by the loader (missing member, filter, decode);
  each tensor key has one shape; no NaN/Inf; with ``contract_in="workers"`` (``auto``'s choice
  from 4 workers per rank on) every batch reached its rank as the worker collated it
  (``rank_batches``).
- The loader config: the preset or key_map asked for; else, for a WebDataset a build wrote for a
  recipe ``mode`` (its manifest's recipe), that mode's preset (``loaders.mode_presets``: its partner
  members in the key_map; ``report["preset"]``, ``report["preset_from"]``); else the key_map inferred
  from the first shard. Check ``members`` (WebDataset): every sample holds each key_map member no
  constant stands in for, naming the samples that lack one and the member (a lost ``ref_latent.pth``).
  A knowledge-distillation dataset (its build's output format ``kd_wds``, or its ``index.json``) gets
  ``kd_path`` (``kd_pair`` without ``path.pth``); with either preset, ``verify/kd.py`` checks each
  sample's pair and trajectory against ``index.json`` (checks ``kd_*``, ``report["kd"]``).
- ``fastgen_partial`` (WebDataset): per rank-worker, the samples FastGen's deterministic loader
  with ``partial=False`` (its default) drops at this batch size (its last incomplete batch); the
  coverage check then says "N samples per pass are never trained on at batch B" (a warning: this
  loader, run with partial batches, still sees them).
"""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from shardsmith.formats.detect import dataset_kind
from shardsmith.formats.tar import ShardUnreadable
from shardsmith.errors import UserError
from shardsmith.formats.wds import (REPAIR_FILE, SHARD_COUNT_FILE, load_shard_counts,
                                    read_ignore_index)
from shardsmith.verify.accounting import count_file as read_count_file, manifest_check, tally
from shardsmith.verify.expected import ExpectedRange, ExpectedWds
from shardsmith.verify.folder_keys import CrossShardKeys
from shardsmith.verify.integrity import neg_prompt_check, shard_integrity, zip_integrity
from shardsmith.verify.contract import ContractRecorder
from shardsmith.verify.owning_build import (BuildUnreadable, dataset_manifest_problem, find_build,
                                            manifest_recipe_problem, unfinished)
from shardsmith.verify.precomputed_check import verify_precomputed
from shardsmith.verify.record import recorded
from shardsmith.verify.ranks import Ranks
from shardsmith.verify.seen_log import SeenFile
from shardsmith.user_paths import resolve_user_path

# where the batch contract is recorded (``verify(contract_in=)``), default first
CONTRACT_MODES = ("auto", "workers", "rank", "workers-only")
# contract_in="auto" records in the workers from this many workers per rank on
AUTO_WORKERS = 4


KEY_MAP_SHARDS, KEY_MAP_FIRST, KEY_MAP_SAMPLES = 8, 64, 16  # what infer_key_map reads (see there)


def infer_key_map(folder: Path) -> dict[str, str]:
    """Batch keys = the member suffixes every sample read has (``latent.pth`` -> ``latent``): the first
    :data:`KEY_MAP_FIRST` samples of the first shard that holds any (an empty shard, such as a repair can
    leave, counts for nothing), and the first :data:`KEY_MAP_SAMPLES` of up to :data:`KEY_MAP_SHARDS` - 1
    more shards spread over the folder, the last included (a key only the first shard's samples carry is
    not a batch key). ``ValueError`` when no shard holds a sample; :class:`ShardUnreadable` for a shard
    tarfile cannot read."""
    from shardsmith.loaders.shard_reader import list_shards, shard_samples

    shards = list_shards(folder)
    k = min(len(shards), KEY_MAP_SHARDS)
    picked = sorted({round(i * (len(shards) - 1) / max(k - 1, 1)) for i in range(k)})
    counts: Counter = Counter()
    n, first = 0, True
    for i in range(len(shards)):
        if not first and i not in picked:
            continue
        samples = shard_samples(folder / shards[i])[:KEY_MAP_FIRST if first else KEY_MAP_SAMPLES]
        first = first and not samples
        for _, members in samples:
            counts.update(members.keys())
            n += 1
    if n == 0:
        raise ValueError(f"no shard of {folder} holds a sample to infer the batch keys from; pass them with "
                         "--key-map, e.g. --key-map real=jpg,condition=txt")
    return {s.split(".")[0]: s for s, c in counts.items() if c == n}


def unreadable_detail(folder: Path, first: ShardUnreadable, shown: int = 5) -> str:
    """The detail of the failed check ``shards``: every shard of ``folder`` that tarfile cannot list,
    each said as ``inspect`` says it (``verify.shard_scan.scan_shard``: where it breaks, what is intact),
    and the way on."""
    from shardsmith.loaders.shard_reader import list_shards, shard_samples
    from shardsmith.verify.shard_scan import scan_shard

    bad = []
    for name in list_shards(folder):
        try:
            shard_samples(folder / name, remember=False)
        except ShardUnreadable as exc:
            bad.append((name, exc.why))
        except OSError as exc:
            bad.append((name, exc.strerror or str(exc)))
    if not bad:  # changed meanwhile: say the one that failed
        bad = [(Path(first.path).name, first.why)]
    said = []
    for name, why in bad[:shown]:
        try:
            t = scan_shard(folder / name).report["truncated"]
        except OSError:
            t = None
        said.append(f"{name}: {t['kind']} at byte {t['break_offset']} ({t['intact_members']} members, "
                    f"{t['intact_samples']} complete samples intact)" if t else f"{name}: {why}")
    more = f"; and {len(bad) - shown} more" if len(bad) > shown else ""
    return (f"{len(bad)} shard(s) cannot be read as tar: " + "; ".join(said) + more
            + f"; run shardsmith inspect {folder} for the details, then shardsmith repair {folder} "
            "(it keeps every intact sample)")


class CountFileError(UserError, ValueError):
    """A malformed ``shard_count.json``: the message names it and ``shardsmith repair``, which rebuilds it."""


def _check_count_file(dataset: Path) -> None:
    """Refuse a ``shard_count.json`` that is not JSON ``{shard: int}`` with the fix, before the loader runs."""
    _, err = load_shard_counts(dataset)
    if err:
        raise CountFileError(f"{dataset / SHARD_COUNT_FILE}: {err}; rebuild it with `shardsmith repair {dataset}` "
                             "(it recounts every shard from its tar headers and keeps the old file "
                             "beside it as a .orig backup)")


@recorded  # the last report of a build's dataset is kept in the build (verify/record.py)
def verify(dataset: str | Path, *, preset: str | None = None, key_map: dict[str, str] | None = None,
           world: int = 2, workers: int = 2, batch_size: int | None = None, batches: int | None = None,
           image_size: int | None = None, timeout: float = 600, contract_in: str = "auto",
           overrides: dict[str, Any] | None = None, progress=None, mode: str | None = None) -> dict[str, Any]:
    """``preset=None`` and ``key_map=None``: the preset of the recipe mode the build that wrote the
    dataset was for (its manifest), else the key_map of the first shard's members.
    ``batch_size=None``: the preset's own batch size (8 without a preset). ``progress``: a
    :class:`~shardsmith.progress.Progress` whose task counts the samples the ranks read (n/N).

    ``mode`` (``.precomputed/`` trees only): the LTX training mode whose folders and keys are checked,
    a key of ``formats.precomputed.MODES`` (t2v, i2v, ..., t2a, image, video); None: the tree's
    stamp (``shardsmith.json`` ``"mode"``), else inferred from its folders.

    ``overrides``: loader-config fields that replace the preset's (e.g. ``{"num_frames": 17,
    "video_size": [64, 96]}`` for the ``video`` preset, whose 81 x 480 x 832 would drop shorter clips).

    ``contract_in`` (WebDataset; EDM ZIPs always record in the rank), see ``CONTRACT_MODES``:
    - ``"auto"`` (default): ``"workers"`` with ``AUTO_WORKERS`` or more workers per rank, else
      ``"rank"``: with few workers they are the bottleneck and the rank's recording overlaps their
      loading; with many, one core per rank cannot keep up with them (BENCHMARKS.md §4).
    - ``"workers"``: every batch crosses from the workers to its rank process, as in
      training; the workers record the value statistics on the collated batch (in parallel),
      and the rank checks that each batch it gets has the keys, dtypes and shapes the worker
      collated, and re-reads its first batch and every ``worker_contract.SPOT_CHECK_EVERY``-th in full, which
      must give the worker's statistics exactly (check ``rank_batches``).
    - ``"rank"``: the rank records the contract from every value it gets (one core per rank
      passes over every byte: the slowest, BENCHMARKS §4).
    - ``"workers-only"``: the workers record it and send only sample ids and statistics: the
      same sharding, decoding and collation, without moving the tensors between processes."""
    if mode is not None:
        from shardsmith.formats.precomputed import mode_dirs

        mode_dirs(mode)  # refuses an unknown mode
    if contract_in not in CONTRACT_MODES:
        raise ValueError(f"contract_in must be one of {', '.join(repr(m) for m in CONTRACT_MODES)}, got {contract_in!r}")
    overrides = dict(overrides or {})  # --set batch_size / num_workers are the --batch-size / --workers flags
    batch_size = overrides.pop("batch_size", batch_size)
    workers = overrides.pop("num_workers", workers)
    if contract_in == "auto":
        contract_in = "workers" if workers >= AUTO_WORKERS else "rank"
    from shardsmith.loaders.presets import get_preset, preset_config

    asked_batch_size = batch_size
    if batch_size is None:
        batch_size = int(get_preset(preset).defaults.get("batch_size", 8)) if preset else 8
    dataset = resolve_user_path(dataset)
    try:
        build = find_build(dataset)
    except BuildUnreadable as exc:  # a damaged ledger: a failed check naming it, no loader run
        return _unfinished_report(dataset, str(exc), world, workers, batch_size, batches, name="ledger")
    not_done = unfinished(build) if build is not None else None
    if not_done:
        return _unfinished_report(dataset, not_done, world, workers, batch_size, batches)
    bad_manifest, manifest_note = dataset_manifest_problem(dataset)
    if not bad_manifest and build is not None and build.has_ledger and build.has_manifest:
        bad_manifest = manifest_recipe_problem(build, dataset)  # an entry lost or added (outputs: {})
    if bad_manifest:  # a broken or unexpected manifest.json: check manifest fails, naming it
        return _unfinished_report(dataset, bad_manifest, world, workers, batch_size, batches, name="manifest")
    kind = dataset_kind(dataset)
    if mode is not None and kind != "precomputed":
        raise ValueError(f"a training mode ({mode!r}) applies to .precomputed/ trees; {dataset} is {kind}")
    picked = None
    if preset is None and key_map is None and kind in ("wds", "wds_buckets"):
        # a dataset a build wrote for a recipe mode: that mode's preset (its partner members in key_map)
        picked = _mode_preset(dataset)
        if picked is not None:
            preset = picked["preset"]
            if asked_batch_size is None:
                batch_size = int(get_preset(preset).defaults.get("batch_size", 8))
    if kind == "wds_buckets":  # one WebDataset folder per bucket: each verified on its own
        from shardsmith.verify.buckets import verify_buckets

        # (each bucket's run unrecorded: the build keeps this output's report, not one per bucket besides it)
        rep = verify_buckets(dataset, verify.__wrapped__, build=build, world=world, workers=workers, batch_size=batch_size,
                             preset=preset,
                             key_map=key_map, batches=batches, image_size=image_size, timeout=timeout,
                             contract_in=contract_in, overrides=overrides, progress=progress)
        if picked is not None:
            rep["preset"], rep["preset_from"] = picked["preset"], picked["from"]
        return rep
    checks: list[dict[str, Any]] = []

    def check(name: str, ok: bool, detail: str) -> None:
        checks.append({"name": name, "ok": bool(ok), "detail": detail})

    report: dict[str, Any] = {"dataset": str(dataset), "kind": kind, "world": world, "workers": workers,
                              "batch_size": batch_size, "batches_per_rank": batches,
                              "contract_in": contract_in if kind == "wds" else "rank"}
    if manifest_note:
        report.setdefault("notes", []).append(manifest_note)
    if preset is not None and kind != "precomputed":
        report["preset"] = preset
        report["preset_from"] = picked["from"] if picked is not None else "asked"
    if kind == "precomputed":
        return verify_precomputed(dataset, report, check, checks, mode=mode, build=build)
    if preset is not None and get_preset(preset).kind != kind:
        raise ValueError(f"preset {preset!r} reads {get_preset(preset).kind} datasets, but {dataset} is {kind}")
    if kind == "wds":
        _check_count_file(dataset)
        try:
            if preset is not None:
                cfg = preset_config(preset, dataset, **{"batch_size": batch_size, "num_workers": workers,
                                                        **(overrides or {})})
                if key_map:
                    cfg = cfg.model_copy(update={"key_map": key_map})
            else:
                cfg = preset_config("image", dataset, presets_map={}, **{
                    "key_map": key_map or infer_key_map(dataset), "image_size": image_size, "batch_size": batch_size,
                    "num_workers": workers, **(overrides or {})})  # a --set key wins over the flag's default
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
                expected = ExpectedWds.scan(dataset, ignore)
                check("rank_splits", False, f"a rank gets no sample at all ({empties[0][2]}); use at most "
                      f"{len(expected)} rank-workers (world x workers) or write smaller shards")
                report.update(checks=checks, ok=False, coverage={}, contract={}, stats={})
                return report
            # every shard's headers, read once: the expected samples numbered per shard, the members check and
            # the keys several shards hold
            members = MembersCheck(cfg, mode_of(preset))
            with CrossShardKeys(dataset) as cross:
                expected = ExpectedWds.scan(dataset, ignore, on_shard=lambda shard, samples: (
                    members.visit(shard, samples), cross.visit(shard, samples)))
                cross.finish()
            count_file = read_count_file(dataset)
            members.report(check)
            if preset in ("kd_pair", "kd_path"):  # each sample's pair and trajectory against index.json (verify/kd.py)
                from shardsmith.verify.kd import check_kd

                report["kd"] = check_kd(dataset, preset, ignore, check)
        except ShardUnreadable as exc:  # a shard tarfile cannot read: a failed check naming each one
            check("shards", False, unreadable_detail(dataset, exc))
            report.update(checks=checks, ok=False, coverage={}, contract={}, stats={})
            return report
    else:
        from shardsmith.loaders.zip import ZipImageDataset

        cfg = preset_config(preset or "class_zip", dataset, **{"batch_size": batch_size, "num_workers": workers,
                                                               "shuffle": False, **(overrides or {})})
        n = len(ZipImageDataset(dataset, use_labels=cfg.use_labels))
        expected, count_file = ExpectedRange(n), {}
        report["empty_slots"] = [{"rank": r, "worker": None, "reason": f"{n} images for {world} ranks"}
                                 for r in range(world) if r >= n]
        spec = {"kind": "zip", "config": cfg.model_dump(mode="json", exclude={"rank", "world_size"}),
                "world": world, "batches": batches, "zip_len": n}

    from shardsmith.progress import Progress

    full = batches is None
    integrity = None
    if not full:  # --batches M: a spot check of the loader, not of every byte
        report.setdefault("notes", []).append(f"integrity not checked: --batches {batches} reads the first batches "
                                              "only; run verify without --batches to hash every "
                                              + ("shard" if kind == "wds" else "byte of the ZIP"))
    else:  # the shards (the ZIP) against the sha256 the build recorded (verify/integrity.py)
        integrity, why_not = (shard_integrity if kind == "wds" else zip_integrity)(dataset, build)
        if why_not:
            report.setdefault("notes", []).append(why_not)
    seen_dir = tempfile.mkdtemp(prefix="shardsmith-verify-")  # the ranks' seen logs (verify/seen_log.py)
    try:
        ranks = Ranks({**spec, "expected": expected.to_spec(), "seen_dir": seen_dir}, world)
        if integrity is not None:
            integrity.start()  # hashed in threads while the ranks run (they are forked already)
        with (progress or Progress(quiet=True)).task(f"verify {dataset.name}",
                                                     total=len(expected) if full else None) as tick:
            results = ranks.collect(timeout, tick)
        errors = [r for r in results if "error" in r]
        cov = None if errors else tally(expected, [SeenFile(r["seen"]) for r in results], full)
        if integrity is not None:
            integrity.finish(check)
    finally:
        if integrity is not None:
            integrity.close()
        shutil.rmtree(seen_dir, ignore_errors=True)
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
        per_rank.append({"rank": r["rank"], "samples": r["seen_count"], "stats": r["stats"]})
    dup, missing, unknown = cov["duplicates"], cov["missing"], cov["unknown"]  # the first 20 of each
    report["coverage"] = {**cov, "per_rank": per_rank}
    if kind == "wds" and cross.n_distinct:  # keys numbered per shard: distinct samples, each trained once
        report.setdefault("notes", []).append(cross.distinct_note())
    if kind == "wds" and cross.n:  # one sample under one key in several shards: the loader sees each (shard, key) once
        check("no_duplicates", False, f"{cov['n_duplicates']} sample(s) seen more than once by the loader, but "
              + cross.same_sample_text(dataset) + f"; shardsmith inspect {dataset} counts them")
    else:
        check("no_duplicates", not dup, f"{cov['n_duplicates']} sample(s) seen more than once"
              + (f", e.g. {dup[:3]}" if dup else ""))
    if kind == "wds":  # what FastGen's loader (partial=False) leaves out of each pass at this batch size
        from shardsmith.verify.accounting import fastgen_partial

        report["fastgen_partial"] = fastgen_partial(len(expected), world, workers, batch_size)
    if full:
        partial_line = report.get("fastgen_partial", {}).get("line")
        check("coverage", not missing and not unknown,
              f"{cov['unique']} of {len(expected)} samples seen exactly once"
              + (f"; missing e.g. {missing[:3]}" if missing else "") + (f"; unknown {unknown[:3]}" if unknown else "")
              + (f"; but {partial_line}" if partial_line else ""))
        if partial_line:
            report.setdefault("warnings", []).append(partial_line)
    if kind == "wds":
        if count_file:
            n_ignored = sum(len(set(v)) for k, v in ignore.items() if k in count_file)
            total = sum(count_file.values()) - n_ignored
            # the same shards, not only the same total: FastGen's fast-forward looks each shard up (KeyError)
            listed_only = sorted(set(count_file) - set(shards))
            unlisted = [s for s in shards if s not in count_file]
            detail = (f"shard_count.json says {sum(count_file.values())} - {n_ignored} ignored = {total}; "
                      f"the tars hold {len(expected)}")
            if listed_only or unlisted:
                detail += "".join([
                    f"; it lists {len(listed_only)} shard(s) not in the folder: {', '.join(listed_only[:5])}"
                    if listed_only else "",
                    f"; it has no entry for {len(unlisted)} shard(s) here: {', '.join(unlisted[:5])} (FastGen's "
                    "deterministic resume raises KeyError on them)" if unlisted else ""])
                detail += (f"; if a shard was renamed, give it back its name, else rebuild the file with "
                           f"`shardsmith repair {dataset}`")
            check("shard_count", total == len(expected) and not listed_only and not unlisted, detail)
        else:
            check("shard_count", False, f"no {SHARD_COUNT_FILE}: deterministic resume in FastGen needs it "
                  "(shardsmith repair writes it)")
        dropped: Counter = Counter()
        examples: dict[str, str] = {}
        for r in results:
            dropped.update(r["stats"].get("dropped", {}))
            for why, ex in (r["stats"].get("examples") or {}).items():
                if ex:
                    examples.setdefault(why, ex[0])
        check("no_drops", not dropped, "loader dropped nothing" if not dropped else
              "loader dropped " + ", ".join(f"{n} ({why}" + (f", e.g. {examples[why]})" if why in examples else ")")
                                            for why, n in dropped.items()))
    manifest_check(dataset, kind, expected, report, check)
    neg = neg_prompt_check(dataset, build) if kind == "wds" else None
    if neg is not None and neg[0] is None:
        report.setdefault("notes", []).append(neg[1])
    elif neg is not None:
        check("neg_prompt", neg[0], neg[1])
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


def _mode_preset(dataset: Path) -> dict[str, str] | None:
    """The preset of the recipe mode the build that wrote ``dataset`` was for (its manifest's recipe),
    or of a knowledge-distillation dataset (``kd_path`` / ``kd_pair``), and where that was read, or None
    (no build manifest names it, no mode, no preset for its format)."""
    from shardsmith.loaders.mode_presets import kd_preset_for, mode_preset_for

    kd = kd_preset_for(dataset)  # a knowledge-distillation dataset: kd_path, or kd_pair without path.pth
    if kd is not None:
        return {"preset": kd[0], "mode": None, "from": kd[1]}
    got = mode_preset_for(dataset)
    if got is None:
        return None
    name, facts = got
    return {"preset": name, "mode": facts.mode, "from": f"mode {facts.mode} of the build ({facts.where})"}


def mode_of(preset: str | None) -> str | None:
    """The recipe mode a preset reads (a mode preset's), else None."""
    if preset is None:
        return None
    from shardsmith.loaders.presets import get_preset

    return get_preset(preset).mode


class MembersCheck:
    """Check ``members``: every sample (less ``ignore_index.json``) holds each ``key_map`` member that no
    ``files_map`` / ``presets_map`` constant stands in for; the loader drops a sample lacking one
    (``missing:<suffix>``). Names the samples and members (a partner a mode's samples need, e.g. a
    lost ``ref_latent.pth``). Fed shard by shard (``visit``, from ``ExpectedWds.scan``'s one pass over
    the headers: no data); keeps a count and the first lacking samples, not a list per sample."""

    SHOWN = 5

    def __init__(self, cfg, mode: str | None):
        optional = set(cfg.files_map) | set(cfg.presets_map)
        self.need = {k: v for k, v in cfg.key_map.items() if k not in optional}
        self.mode = mode
        self.n = self.n_lacking = 0
        self.lacking: list[str] = []

    def visit(self, shard: str, samples) -> None:
        for key, members in samples:
            self.n += 1
            gone = [f"{suffix} ({bkey})" for bkey, suffix in self.need.items() if suffix not in members]
            if gone:
                self.n_lacking += 1
                if len(self.lacking) < self.SHOWN:
                    self.lacking.append(f"{shard}/{key} has no {', '.join(gone)}")

    def report(self, check) -> None:
        what = f"mode {self.mode}'s key_map" if self.mode else "key_map"
        km = ", ".join(f"{k}={v}" for k, v in self.need.items())
        if self.n_lacking:
            check("members", False, f"{self.n_lacking} of {self.n} sample(s) lack a member of the {what} ({km}), so "
                  f"the loader drops them: " + "; ".join(self.lacking) + ("; ..." if self.n_lacking > self.SHOWN else ""))
        else:
            check("members", True, f"each of the {self.n} sample(s) has every member of the {what} ({km})")


def _unfinished_report(dataset: Path, why: str, world: int, workers: int, batch_size: int,
                       batches: int | None, name: str = "build_finished") -> dict[str, Any]:
    """The report of a dataset whose build is not finished (or whose build's ledger or manifest cannot be
    read: check ``name``): one failed check, no loader run."""
    try:
        kind = dataset_kind(dataset)
    except ValueError:
        kind = "unknown"
    return {"dataset": str(dataset), "kind": kind, "world": world, "workers": workers, "batch_size": batch_size,
            "batches_per_rank": batches, "contract_in": None,
            "checks": [{"name": name, "ok": False, "detail": why}],
            "coverage": {}, "contract": {}, "stats": {}, "ok": False}


def format_verify(report: dict[str, Any]) -> str:
    lines = [f"verify {report['dataset']} ({report['kind']}): world {report['world']} x workers "
             f"{report['workers']}, batch {report['batch_size']}"
             + {"workers": ", contract recorded in the workers (batches sent to the ranks)",
                "workers-only": ", contract recorded in the workers (batches not sent to the ranks)"}.get(
                 report.get("contract_in"), "")]
    if report.get("preset"):
        lines.append(f"  preset: {report['preset']}" + (f" ({report['preset_from']})"
                                                          if report.get("preset_from") not in (None, "asked") else ""))
    if report.get("key_map"):
        lines.append("  key_map: " + ", ".join(f"{k}={v}" for k, v in report["key_map"].items()))
    for ch in report["checks"]:
        lines.append(f"  [{'PASS' if ch['ok'] else 'FAIL'}] {ch['name']}: {ch['detail']}")
        bucket = (report.get("buckets") or {}).get(ch["name"][len("bucket "):]) if ch["name"].startswith("bucket ") \
            else None
        for sub in (bucket or {}).get("checks", []) if not ch["ok"] else []:  # what failed in that bucket
            if not sub["ok"]:
                lines.append(f"      [FAIL] {sub['name']}: {sub['detail']}")
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
