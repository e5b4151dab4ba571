"""The build's manifest (``manifest.json``): counts per output and split that reconcile with the
ledger, the sources and their item hashes, the models, timings and warnings; and the summary
lines the build prints.

Contract
- ``make_manifest`` raises :class:`InvariantError` when an output's or a split's counts do not
  reconcile (inputs != written + skipped + failed): a sample was lost, always a bug.
- Every item is counted once per output, and once overall with its worst status across the
  outputs that take its source.
"""

from __future__ import annotations

import hashlib
from typing import Any

from shardsmith import __version__, report
from shardsmith.outputs import OutputContext, kind_of
from shardsmith.plan.ledger import Ledger
from shardsmith.recipe import canonical
from shardsmith.safety import holdout
from shardsmith.split.assign import HOLDOUT, TRAIN


class InvariantError(RuntimeError):
    """inputs != written + skipped + failed: a sample was lost. Always a bug; never ignored."""


def make_manifest(ctx, octx: OutputContext, fp: str, blocks: dict[str, Any]) -> dict[str, Any]:
    """The manifest of a finished build (``ctx``: its BuildContext; ``blocks``: each output's
    manifest block so far). Raises :class:`InvariantError` where counts do not reconcile."""
    ledger, recipe = ctx.ledger, ctx.recipe
    outputs: dict[str, Any] = {}
    for o in recipe.outputs:
        total, splits = report.tally(ledger.status_rows(o.name, written=False), ledger.written_counts(o.name))
        for name, block in [("all", total), *splits.items()]:
            if not report.balanced(block):
                raise InvariantError(f"output {o.name} split {name}: counts do not reconcile: {block}")
        outputs[o.name] = {**blocks[o.name], "counts": total, "splits": splits}
    taken = sorted({i for o in recipe.outputs for i in recipe.source_ids(o)})
    counts, splits = report.tally(overall_rows(ledger, taken), ledger.written_counts(None, taken))
    sources = []
    for info in ctx.sources:
        n, nbytes = ledger.db.execute("SELECT COUNT(*), COALESCE(SUM(size_bytes),0) FROM items WHERE source=?",
                                      (info.index,)).fetchone()
        # the item hashes in plan order, concatenated and hashed once
        shas = ledger.db.execute("SELECT COALESCE(sha256,'-') FROM items WHERE source=? ORDER BY idx", (info.index,))
        h = hashlib.sha256()
        for (sha,) in shas:  # streamed: the same digest as hashing the joined string
            h.update(sha.encode())
        sources.append({"name": info.name, "kind": info.kind, "path": info.path, "origin": info.origin,
                        "license": info.license, "items": n, "bytes": nbytes,
                        "labels": list(info.label_names) if info.label_names else None,
                        "sha256_of_item_hashes": h.hexdigest(),
                        # files the folder walk passed over (hidden, no media extension), only when there were any
                        **({"ignored": ig} if (ig := ledger.get_meta(f"ignored:{info.index}")) else {})})
    warnings = []
    if ctx.stage is not None and ctx.stage.describe()["random_weights"]:
        warnings.append(f"models with random weights ({', '.join(ctx.stage.describe()['random_weights'])}): "
                        "latents and embeddings are for checking plumbing, not model-space data")
    for src in sources:
        if src.get("ignored"):
            ig = src["ignored"]
            n = sum(v for k, v in ig.items() if k != "examples")
            kinds = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in ig.items() if k != "examples")
            warnings.append(f"source {src['name']!r}: {n} file(s) or folder(s) passed over, not counted as inputs "
                            f"({kinds}; e.g. {', '.join(ig['examples'])}); media among them needs a media "
                            "extension (jpg, png, mp4, wav ...) and a name without a leading '.'")
    for o in recipe.outputs:
        warnings += kind_of(o).warnings(o, octx, outputs[o.name]["files"])
    return {
        "shardsmith_version": __version__,
        "recipe_fingerprint": fp,
        "recipe": canonical(recipe),
        "created": ledger.get_meta("started"),
        "split": {"seed": recipe.split.seed, "holdout": recipe.split.holdout, "dedup": recipe.split.dedup},
        **({"lora_trigger": recipe.lora_trigger} if recipe.lora_trigger else {}),  # in front of every caption
        "sources": sources,
        "counts": counts,
        "splits": splits,
        "outputs": outputs,
        "models": ctx.stage.describe() if ctx.stage is not None else None,
        "timings": ctx.timings,
        "warnings": warnings,
    }


def overall_rows(ledger: Ledger, taken: list[int]):
    """(split, item_id, status, detail) of each item that some output did not write: its worst
    status across the outputs taking it (the written ones are counted by ``written_counts``)."""
    rows = ledger.not_all_written(taken)
    cur, head, statuses = None, None, []
    for idx, split, item_id, status, detail in rows:
        if idx != cur:
            if cur is not None:
                yield (*head, *report.worst(statuses))
            cur, head, statuses = idx, (split, item_id), []
        statuses.append((status, detail) if status else
                        ("skipped:not_in_any_output", "no output of the recipe takes this item's source"))
    if cur is not None:
        yield (*head, *report.worst(statuses))


def _an_output_wrote(manifest: dict[str, Any]) -> bool:
    """Whether any output holds a sample: the totals count an item written only where every output that
    takes it wrote it (one output skipping everything, e.g. by ``max_aspect``, leaves them at 0)."""
    for o in (manifest.get("outputs") or {}).values():
        for split in ((o or {}).get("splits") or {}).values():
            if isinstance(split, dict) and split.get("written"):
                return True
    return False


def nothing_written(manifest: dict[str, Any], out: str) -> str | None:
    """The message of a finished build that holds no sample at all (its every input failed or was skipped,
    in this run or an earlier one: the totals, not this run's), or None when it wrote something or had no
    input. The counts by reason, an example and the fix; the manifest and the ledger stay for a re-run."""
    c = manifest.get("counts") or {}
    if c.get("written") or not c.get("inputs") or _an_output_wrote(manifest):
        return None
    reasons = sorted([(n, f"failed:{r}") for r, n in (c.get("failed") or {}).items()]
                     + [(n, f"skipped:{r}") for r, n in (c.get("skipped") or {}).items()], key=lambda x: (-x[0], x[1]))
    by = ", ".join(f"{st} {n}" for n, st in reasons)
    ex = (c.get("examples") or {}).get(reasons[0][1]) if reasons else None
    eg = f"; e.g. {ex['detail']}" if isinstance(ex, dict) and ex.get("detail") else ""
    n = c["inputs"]
    every = "its one input failed or was skipped" if n == 1 else f"all {n} inputs failed or were skipped"
    return (f"no sample was written to {out}: {every} ({by}{eg}). "
            f"Each item's reason is in {out}/manifest.json and the report; fix or replace those inputs (or the "
            "setting a skip names), then run the same command again with --overwrite, or into a new --out")


def written_phrase(manifest: dict[str, Any]) -> str:
    """What the CLI's ``done:`` line says was written: ``N of M inputs written``; where the outputs wrote
    different counts (the totals count an item written only where every output taking it wrote it), each
    output's count too, so one output's 0 does not read as the whole build's."""
    c = manifest["counts"]
    head = f"{c['written']} of {c['inputs']} inputs written"
    per = {name: (o.get("counts") or {}).get("written", 0) for name, o in manifest.get("outputs", {}).items()}
    if len(per) < 2 or all(n == c["written"] for n in per.values()):
        return head
    return f"{head} to every output; by output: " + ", ".join(f"{name} {n}" for name, n in per.items())


def summary(manifest: dict[str, Any]) -> list[str]:
    lines = report.format_block("all outputs (per item)", manifest["counts"])
    for name, o in manifest["outputs"].items():
        lines += report.format_block(f"output {name}", o["counts"])
        for split, blk in o["splits"].items():
            lines += ["  " + x for x in report.format_block(split, blk)[:1]]
        if HOLDOUT in o["splits"]:
            lines.append("  " + holdout.achieved(o["splits"].get(TRAIN, {}).get("written", 0),
                                                 o["splits"][HOLDOUT]["written"]))
        for split, blk in o.get("files", {}).items():
            lines += bucket_lines(split, blk.get("buckets") or {})
        lines += audio_lines(o.get("audio"))
    lines += model_lines(manifest.get("models"))
    lines += [f"warning: {w}" for w in manifest["warnings"]]
    return lines


def model_lines(models: dict[str, Any] | None) -> list[str]:
    """One line on how the build ran its encoders: device and batch, the compile decision and why (and a resume's
    note where it ran otherwise than the build began), the JPEG
    decoder, when the first batch was done, the steady-state rate and the GPU's idle share (the audio encoder's
    too), the text pass of
    ``models.offload`` text-first, the GPU's peak."""
    if not models or "device" not in models:
        return []
    parts = [f"encoders on {models['device']}, batch {models.get('batch_size')}"]
    comp = models.get("compile") or {}
    if comp.get("reason"):
        parts.append(f"compile {'on' if comp.get('compiled') else 'off'} ({comp['reason']})"
                     + (f" (note: {comp['note']})" if comp.get("note") else ""))
    if models.get("image_decoder"):
        parts.append(f"JPEGs decoded by {models['image_decoder']}")
    ss = models.get("steady_state") or {}
    if ss.get("first_batch_done_s") is not None:
        parts.append(f"first batch done {ss['first_batch_done_s']:.1f} s after the outputs started")
    if ss.get("items_per_s"):
        idle = (ss.get("gpu_idle") or {}).get("idle_frac")
        parts.append(f"{ss['items_per_s']:.1f} items/s in the steady state"
                     + (f", GPU idle {100 * idle:.1f} %" if idle is not None else ""))
    audio = models.get("audio_steady_state") or {}
    if audio.get("items_per_s"):
        idle = audio.get("gpu_idle") or {}
        parts.append(f"audio encoder {audio['items_per_s']:.1f} items/s in the steady state"
                     + (f", GPU idle {100 * idle['idle_frac']:.1f} % between its batches"
                        if idle.get("idle_frac") is not None else ""))
    off = models.get("offload") or {}
    if off.get("mode") == "text-first":  # encode/offload.py: the text encoder ran alone, before the VAE loaded
        tp = off.get("text_pass") or {}
        parts.append(f"text encoded first, then freed (models.offload {off.get('setting')}: {tp.get('encoded', 0)} "
                     f"caption(s) encoded, {tp.get('cached_before', 0)} kept from an earlier run)")
    peak = (models.get("memory") or {}).get("measured_peak_bytes")
    if peak:
        parts.append(f"GPU peak {peak / 2 ** 30:.2f} GiB")
    return ["models: " + "; ".join(parts)]


def audio_lines(audio: dict[str, Any] | None) -> list[str]:
    """One summary line per split of an output that writes audio: samples with audio, without, and
    the items that failed for their audio (by reason); one line when audio was skipped."""
    if not audio:
        return []
    if audio.get("skipped"):
        return ["  audio: skipped (--skip-audio): no audio latents written"]
    lines = []
    for split, b in audio.get("splits", {}).items():
        failed = ", ".join(f"{n} {st.split(':', 1)[1]}" for st, n in sorted(b["failed"].items()))
        lines.append(f"  {split} audio: {b['with_audio']} sample(s) with audio latents"
                     + (f", {b['without_audio']} written without audio" if b["without_audio"] else "")
                     + (f", failed for their audio: {failed}" if failed else "")
                     + f" (resampled to {audio['rate']} Hz{', required' if audio.get('required') else ''})")
    return lines


def bucket_lines(split: str, buckets: dict[str, dict[str, Any]]) -> list[str]:
    """One summary line per bucket of a latent output's split: samples, latent shape, the share
    of the available frames used, and the mean share of the source area the crop kept."""
    from shardsmith.formats.wds import is_audio_bucket

    lines = []
    for bucket, b in buckets.items():
        used = f"{b['frames_used']}/{b['frames_available']} frames used" if b.get("frames_available") else ""
        shape = "x".join(map(str, b["latent_shape"])) if b.get("latent_shape") else "?"
        if not bucket:  # items of no bucket (audio files without audio.durations): nothing to say per bucket
            continue
        if is_audio_bucket(bucket):  # an audio duration: no frames, no crop
            lines.append(f"  {split} bucket {bucket}: {b['samples']} sample(s), audio latent {shape}")
            continue
        lines.append(f"  {split} bucket {bucket}: {b['samples']} sample(s), latent {shape}"
                     f"{', ' + used if used else ''}, crop keeps {b['mean_area_kept']:.0%} of the area on average")
    return lines
