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
5. :mod:`~shardsmith.scan.verdicts`: warnings and whether there is enough data for
   ``batch * updates`` samples seen; :mod:`~shardsmith.scan.format`: the text rendering.

Counting rules: an item is a *problem* when the planner did not pass it (its status and
detail, skipped duplicates excepted) or the transform cannot decode it; *usable* is the
``usable`` view (:mod:`~shardsmith.scan.usable`); ``enough_data.unique`` is the number of
usable training items that are not an extra copy.
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
from shardsmith.scan.format import format_scan, human_bytes
from shardsmith.scan.histograms import ASPECT_BINS, SHORT_SIDE_BINS
from shardsmith.scan.usable import define_usable
from shardsmith.scan.verdicts import MAX_REPEAT_DEFAULT, data_warnings, enough_data
from shardsmith.split.assign import HOLDOUT, TRAIN

__all__ = ["ASPECT_BINS", "SHORT_SIDE_BINS", "format_scan", "human_bytes", "output_bytes", "sample_bytes", "scan"]


def scan(recipe: Recipe, *, batch: int | None = None, updates: int | None = None,
         max_repeat: float = MAX_REPEAT_DEFAULT, size_sample: int = 32, workers: int | None = None) -> dict:
    """Dry-run ``recipe``'s plan and decode (writing nothing) and return the scan report (a plain dict).
    ``size_sample``: items made per image output for its size estimate; ``workers``: decode threads."""
    threads = workers or recipe.workers or min(32, (os.cpu_count() or 4) * 2)
    with planned(recipe) as run:
        db = run.ledger.db
        decode_all(run.ledger, recipe.images, threads)
        define_usable(db, recipe.images.min_size)
        srcs = figures.sources(db, run.sources)
        probs = figures.problems(db)
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
        }
        per_split = dict(db.execute("SELECT split, COUNT(*) FROM usable GROUP BY split"))
        unique = db.execute("SELECT COUNT(*) FROM usable WHERE split = ? AND dup_of IS NULL", (TRAIN,)).fetchone()[0]
        warnings = data_warnings(report)
        estimate = {}
        for o in recipe.outputs:
            est = estimate_output(o, recipe, run.ledger, run.sources, size_sample, threads)
            estimate[o.name] = est.block
            warnings += est.warnings
    usable = per_split.get(TRAIN, 0) + per_split.get(HOLDOUT, 0)
    enough = enough_data(usable, per_split.get(HOLDOUT, 0), unique, batch, updates, max_repeat)
    report.update(usable=usable, estimate=estimate, enough_data=enough, warnings=warnings + enough["warnings"])
    json.dumps(report)  # fail here, not in the caller, if something is not serialisable
    return report


from shardsmith.api import callable_module  # noqa: E402 - after the module's own names

callable_module(__name__, "scan")  # shardsmith.scan(...) is shardsmith.api.scan
