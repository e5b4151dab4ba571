"""``scan``: say what a build would meet, without writing a dataset.

``scan(recipe, batch=..., updates=...)`` is a dry run of the build's own steps and returns a
plain, JSON-serialisable report:

1. :mod:`~shardsmith.scan.dry_run`: the build's planner fills a throwaway ledger (no file
   name, gone afterwards): the same probe, statuses and reasons, keys, exact-duplicate groups and splits
   a build records;
2. :mod:`~shardsmith.scan.decode_check`: the transform's full decode of every image the plan
   read, so truncated or corrupt files are found now and pictures are measured upright;
3. :mod:`~shardsmith.scan.figures`: the report's figures, as SQL aggregates over the ledger
   (sources, licences, kinds, image histograms, problems, duplicates, labels, captions);
4. :mod:`~shardsmith.scan.estimate`: each image output's bytes on disk, from a deterministic
   sample made by the build's sample makers and scaled as the build's space check scales;
5. :mod:`~shardsmith.scan.media`: video clips and audio files probed in worker processes (at most
   ``max_probe``, a deterministic sample beyond); :mod:`~shardsmith.scan.takes`: what each output
   would do with each planned item (its terminal status, bucket and sample info), decided by that
   output's own sample maker without making the sample, into the throwaway ledger's ``results`` as a
   build records them; :mod:`~shardsmith.scan.media_figures`: the histograms and the per-bucket fit
   table (the first latent output cut to buckets, else the first ``video_wds``, else an audio-only
   latent output's ``audio.durations``); :mod:`~shardsmith.scan.latent_size`: each latent output's bytes
   from the buckets and the VAE's compression factors;
6. :mod:`~shardsmith.scan.verdicts`: warnings and whether there is enough data for
   ``batch * updates`` samples seen; :mod:`~shardsmith.scan.format`: the text rendering.

Counting rules: ``outputs[<name>].counts`` is the counts block a build of the recipe records for
that output (``inputs == written + skipped + failed``; clips the probe sampled out are not in it,
``not_probed`` says how many); an item is a *problem* when the planner did not pass it (its status
and detail, skipped duplicates excepted) or an output taking it would fail it (the first in recipe
order; an item no output decides: its decode or probe failure); *usable* counts the items some output
writes (an image output's are the ``usable`` view, :mod:`~shardsmith.scan.usable`);
``enough_data.unique`` is the number of usable training items that are not an extra copy.
"""

from __future__ import annotations

import json
import os

from shardsmith.recipe import Recipe
from shardsmith.safety.estimate import output_bytes, sample_bytes
from shardsmith.scan import figures
from shardsmith.scan.decode_check import decode_all
from shardsmith.scan.dry_run import planned
from shardsmith.scan.estimate import estimate_output
from shardsmith.scan.latent_size import estimate_latent
from shardsmith.scan.media import MAX_PROBE, probe_all
from shardsmith.scan.media_figures import audio as audio_figures, bucket_fit, videos as video_figures
from shardsmith.scan.format import format_scan, human_bytes
from shardsmith.scan.histograms import ASPECT_BINS, SHORT_SIDE_BINS
from shardsmith.scan.takes import decide_rest, deciders, output_counts
from shardsmith.scan.usable import define_usable
from shardsmith.scan.verdicts import MAX_REPEAT_DEFAULT, check_training_figures, data_warnings, enough_data
from shardsmith.split.assign import HOLDOUT, TRAIN

__all__ = ["ASPECT_BINS", "SHORT_SIDE_BINS", "format_scan", "human_bytes", "output_bytes", "sample_bytes", "scan"]


def scan(recipe: Recipe, *, batch: int | None = None, updates: int | None = None,
         max_repeat: float = MAX_REPEAT_DEFAULT, size_sample: int = 32, workers: int | None = None,
         max_probe: int = MAX_PROBE, progress=None, grad_accum: int = 1, world: int = 1) -> dict:
    """Dry-run ``recipe``'s plan and decode (writing nothing) and return the scan report (a plain dict).
    ``size_sample``: items made per image output for its size estimate; ``workers``: decode threads;
    ``max_probe``: clips probed at most (a deterministic sample beyond); ``progress``: a
    :class:`~shardsmith.progress.Progress` for the plan, decode and probe bars (none when None)."""
    from shardsmith.progress import Progress

    check_training_figures(batch, updates, max_repeat, grad_accum, world)  # before any probing
    progress = progress or Progress(quiet=True)
    threads = workers or recipe.workers or min(32, (os.cpu_count() or 4) * 2)
    procs = workers or recipe.workers or min(8, os.cpu_count() or 2)
    with planned(recipe, progress) as run:
        db = run.ledger.db
        with progress.task("decode", total=None) as tick:
            decode_all(run.ledger, recipe.images, threads, on_total=tick.set_total, tick=tick.advance)
        define_usable(db, recipe.images.min_size)
        ds = deciders(recipe, run.ledger, run.sources)
        with progress.task("probe clips", total=None) as tick:
            _, left_out = probe_all(run.ledger, ds, workers=procs, max_probe=max_probe, on_total=tick.set_total,
                                    tick=tick)
        decide_rest(run.ledger, ds)
        srcs = figures.sources(db, run.sources)
        probs = figures.problems(db, [d.output for d in ds])
        labels, labels_usable = figures.labels(db)
        report = {
            "sources": srcs,
            "items": sum(s["items"] for s in srcs.values()),
            "bytes": sum(s["bytes"] for s in srcs.values()),
            "licenses": figures.licenses(srcs),
            "kinds": figures.kinds(db),
            "images": figures.images(db, recipe.images.min_size),
            "problems": probs,
            "problem_counts": figures.problem_counts(probs),
            "duplicates": figures.duplicates(db, recipe.split.dedup),
            "labels": labels,
            "labels_usable": labels_usable,
            "captions": figures.captions(db),
            "videos": video_figures(db, left_out),
            "audio": audio_figures(db),
            "outputs": {d.output: output_counts(run.ledger, d) for d in ds},
            "not_taken": figures.not_taken(db),
        }
        if left_out:
            for d in ds:
                if d.probes:
                    report["outputs"][d.output]["not_probed"] = run.ledger.missing_results(d.output, sorted(d.sources))
        fitted = _bucket_output(recipe)
        if fitted is not None:
            report["buckets"] = bucket_fit(db, *fitted)
            report["buckets"]["sampled_out"] = left_out
        # what a build would train on: the items some output writes
        trainable = ("(SELECT * FROM items WHERE plan_status = 'ok' AND idx IN "
                     "(SELECT idx FROM results WHERE status = 'written'))")
        per_split = dict(db.execute(f"SELECT split, COUNT(*) FROM {trainable} GROUP BY split"))
        unique = db.execute(f"SELECT COUNT(*) FROM {trainable} WHERE split = ? AND dup_of IS NULL",
                            (TRAIN,)).fetchone()[0]
        warnings = data_warnings(report)
        warnings += _holdout_refusal(recipe, run.ledger) + _kinds_refusal(recipe, run.ledger)
        estimate = {}
        for o in recipe.outputs:
            if _is_latent(o):
                estimate[o.name] = estimate_latent(o, recipe, run.ledger, run.sources, left_out)
                continue
            est = estimate_output(o, recipe, run.ledger, run.sources, size_sample, threads)
            estimate[o.name] = est.block
            warnings += est.warnings
        if left_out:
            warnings.append(f"{left_out} clip(s) were not probed (more than {max_probe}): the video and audio "
                            "histograms, the bucket table, the outputs' counts and latent sizes describe a "
                            "deterministic sample")
    usable = per_split.get(TRAIN, 0) + per_split.get(HOLDOUT, 0)
    enough = enough_data(usable, per_split.get(HOLDOUT, 0), unique, batch, updates, max_repeat, grad_accum, world)
    report.update(usable=usable, estimate=estimate, enough_data=enough, warnings=warnings + enough["warnings"])
    json.dumps(report)  # fail here, not in the caller, if something is not serialisable
    return report


def _holdout_refusal(recipe: Recipe, ledger) -> list[str]:
    """The build's own holdout check (:func:`~shardsmith.safety.holdout.refuse_empty_train`, on the same
    counts of planned items) as a warning: a build of this recipe would stop there."""
    from shardsmith.safety.holdout import HoldoutError, refuse_recipe_empty_train

    try:
        refuse_recipe_empty_train(recipe, ledger)
    except HoldoutError as exc:
        return [f"build would refuse this holdout: {exc}"]
    return []


def _kinds_refusal(recipe: Recipe, ledger) -> list[str]:
    """The build's check, after its plan, that every output takes some item of its sources
    (``build._refuse_kinds_not_taken``, on the same plan) as a warning: a build of this recipe would stop there."""
    from shardsmith.build import _refuse_kinds_not_taken
    from shardsmith.errors import UserError

    try:
        _refuse_kinds_not_taken(recipe, ledger)
    except UserError as exc:
        return [f"build would refuse this recipe: {exc}"]
    return []


def _is_latent(o) -> bool:
    from shardsmith.outputs.latent import LatentKind
    from shardsmith.outputs.registry import kind_of

    return isinstance(kind_of(o), LatentKind)


def _bucket_output(recipe: Recipe) -> tuple[str, list[str]] | None:
    """``(output, buckets)`` of the bucket table: the first latent output cut to ``geometry.buckets``, else the
    first ``video_wds`` (its buckets of more than one frame), else the first latent output of an audio-only
    dataset cut to ``audio.durations`` (one bucket per duration); None without any."""
    from shardsmith.formats.wds import audio_bucket
    from shardsmith.recipe import VideoWdsOutput
    from shardsmith.transform.buckets import parse_buckets

    buckets = list(recipe.geometry.buckets or [])
    latent = [o for o in recipe.outputs if _is_latent(o)]
    if latent and buckets:
        return latent[0].name, buckets
    video = [o for o in recipe.outputs if isinstance(o, VideoWdsOutput)]
    if video and buckets:
        return video[0].name, [str(b) for b in parse_buckets(buckets) if b.frames > 1]
    audio = [o for o in latent if any(a is o for a in recipe.audio_outputs())]
    if audio and recipe.audio.durations:
        return audio[0].name, [audio_bucket(d) for d in recipe.audio.durations]
    return None


from shardsmith.api import callable_module  # noqa: E402 - after the module's own names

callable_module(__name__, "scan")  # shardsmith.scan(...) is shardsmith.api.scan
