"""``shardsmith distill``: a recipe with a ``kd_wds`` output, built like every other output.

Contract
- ``distill(recipe, out, ...)``: refuses (:class:`DistillError`, exit code 2) a recipe without a
  ``kd_wds`` output, naming ``shardsmith build`` for the others; otherwise it is
  :func:`shardsmith.build.build` of that recipe: the same ledger, units as jobs, kill -9 resume to
  the same bytes, ``--overwrite`` beside the old build, manifest and report. The teacher samples the
  train split's prompts only; each holdout prompt is ``skipped:holdout``.
- A resume of a build whose source ``neg_prompt_emb.npy`` (``distill.text: source`` with guidance) changed
  since it began is refused before the build starts
  (:func:`~shardsmith.distill.sources.refuse_changed_negative`), naming the file and ``--overwrite``.
- With ``distill.preview: N`` the teacher first samples N training prompts and their decoded pictures
  are written to ``OUT/.shardsmith/preview/`` (:mod:`shardsmith.distill.preview`) before the first
  batch of the run.
"""

from __future__ import annotations

import os
from typing import Any

from shardsmith.errors import UserError
from shardsmith.recipe import KdWdsOutput, Recipe


class DistillError(UserError):
    """``shardsmith distill`` of a recipe that has nothing to distil."""


def distill(recipe: Recipe, out: str | os.PathLike, *, overwrite: bool = False, quiet: bool = False,
            workers: int | None = None, console=None, report: bool = False) -> dict[str, Any]:
    from shardsmith.build import build

    if not any(isinstance(o, KdWdsOutput) for o in recipe.outputs):
        raise DistillError("shardsmith distill writes a kd_wds output, and the recipe has none: add outputs: "
                           "[{format: kd_wds}] with models.teacher and distill: (see the README's distillation "
                           "section), or build the recipe's outputs with shardsmith build")
    from shardsmith.distill.sources import check_guidance, refuse_changed_negative

    check_guidance(recipe)  # also part of the build's precheck; here it comes before anything else
    # a resume whose source neg_prompt_emb.npy changed would mix two negative prompts: refused before any model
    refuse_changed_negative(recipe, out, overwrite)
    return build(recipe, out, overwrite=overwrite, quiet=quiet, workers=workers, console=console, report=report)
