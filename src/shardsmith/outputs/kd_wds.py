"""``format: kd_wds``: knowledge-distillation shards, written by ``shardsmith distill``.

Every sample is one training prompt sampled by the teacher (``models.teacher``, ``distill:``):
``txt``, ``txt_emb.pth``, ``noise.pth``, ``latent.pth``, ``path.pth`` (``path: true``) and ``json``
(:mod:`shardsmith.sinks.kd_members`); numeric shards ``NNNNN.tar``, ``shard_count.json`` and
``index.json`` (:mod:`shardsmith.formats.kd`) beside them. Only the train split is sampled: a
holdout prompt is ``skipped:holdout`` and never reaches the teacher. An item without a caption is
``skipped:no_caption``. Read by the ``kd_pair`` and ``kd_path`` loader presets.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from shardsmith.atomic import atomic_write_json
from shardsmith.formats.kd import kd_index
from shardsmith.formats.wds import JSON, KD_INDEX_FILE
from shardsmith.outputs.base import OutputContext, OutputKind
from shardsmith.outputs.prompt_wds import PromptSampleMaker
from shardsmith.recipe import KdWdsOutput
from shardsmith.records import WRITTEN, ItemError, PlannedItem, SampleResult
from shardsmith.split.assign import TRAIN


class KdSampleMaker(PromptSampleMaker):
    """The prompt sample of :class:`PromptSampleMaker`, its ``json`` with the sample's seed and shape,
    and what the teacher samples (``res.teacher``: the sample shape, and with ``distill.text: source``
    the prompt's embedding read from its source)."""

    def __init__(self, output: KdWdsOutput, sources, distill, caption_changed: frozenset[str] = frozenset()):
        super().__init__(output, sources)
        self.seed, self.shape, self.text = distill.seed, distill.shape, distill.text
        self.caption_changed = caption_changed  # items whose prompt was edited since the plan (a resume)

    def __call__(self, item: PlannedItem) -> SampleResult:
        from shardsmith.distill.sources import teacher_input
        from shardsmith.distill.trajectories import sample_seed

        if item.item_id in self.caption_changed:  # as a medium changed since the plan is
            return SampleResult(idx=item.idx, status="failed:changed_since_plan",
                                detail=f"{item.item_id}: its prompt (caption) changed after it was planned; re-run "
                                       "with --overwrite to plan again")
        res = super().__call__(item)
        if res.status != WRITTEN:
            return res
        try:
            res.teacher = teacher_input(item, self.sources[item.source].path, self.shape, self.text)
        except ItemError as exc:
            return SampleResult(idx=item.idx, status=exc.status, detail=exc.detail)
        if JSON in res.members:
            meta = json.loads(res.members[JSON])
            meta["seed"] = sample_seed(self.seed, item.item_id)
            meta["shape"] = list(res.teacher.shape)
            res.members[JSON] = json.dumps(meta, sort_keys=True, ensure_ascii=False).encode("utf-8")
        return res


def _captions_changed(o, ctx: OutputContext) -> frozenset[str]:
    """Once the plan is complete, the items whose prompt was edited since it (a table's caption cell, a sidecar
    .txt, a prompt dataset's txt; a resume after an edit): the build warned of them, and they fail as
    ``changed_since_plan`` as a changed medium does, never sampled from a prompt the source no longer holds. (One
    listing of the prompt sources per run, beside the teacher's sampling of every prompt.)"""
    ledger = ctx.ledger
    if ledger is None or ledger.path is None or not ledger.get_meta("plan_complete"):
        return frozenset()
    import sqlite3
    from datetime import datetime

    from shardsmith.safety.source_changes import source_changes
    from shardsmith.sources import open_sources
    from shardsmith.sources.base import SourceError

    started = ledger.get_meta("started")
    since = datetime.fromisoformat(started).timestamp() - 1 if started else float("inf")
    try:
        changes = source_changes(ledger.path, open_sources(ctx.recipe, exclude=[ctx.root]), since, collect=True)
    except (SourceError, OSError, sqlite3.Error):
        return frozenset()  # (the build's own warning says it could not check)
    return frozenset(changes.caption_changed or ())


class KdWdsKind(OutputKind):
    format = "kd_wds"
    model = KdWdsOutput
    encoders = ("text", "teacher")
    roles = ()  # the caption only
    preset = "kd_path"

    def splits(self, o, recipe) -> tuple[str, ...]:
        return (TRAIN,)  # the teacher never sees a holdout prompt

    def maker(self, o, ctx: OutputContext):
        from shardsmith.distill.sources import settle_negative

        # a source's neg_prompt_emb.npy changed since the samples written so far: refused (never two negatives)
        settle_negative(ctx.recipe, ctx.ledger, ctx.root, o.name)
        return KdSampleMaker(o, ctx.sources, ctx.recipe.distill, _captions_changed(o, ctx))

    def sink(self, o, ctx: OutputContext, dest: Path, split: str):
        from shardsmith.sinks.wds import WdsSink

        return WdsSink(o, dest)

    def renderer(self, o, ctx: OutputContext):
        from shardsmith.distill.preview import write_preview
        from shardsmith.sinks.kd_members import KdMembers

        d = ctx.recipe.distill
        return KdMembers(o, tuple(d.shape or ()), len(d.t_list) - 1,
                         preview=lambda stage: write_preview(stage, ctx.recipe, ctx.ledger, ctx.root))

    def finalize(self, o, ctx: OutputContext, sink, split: str, dest: Path) -> dict[str, Any]:
        from shardsmith.distill.trajectories import Sampler, sample_seed

        info = super().finalize(o, ctx, sink, split, dest)
        d, stage = ctx.recipe.distill, ctx.stage()
        desc = stage.describe()
        s = Sampler.from_recipe(ctx.recipe)
        samples = [(shard, key, sample_seed(d.seed, item_id))
                   for shard, key, item_id in ctx.ledger.written_ids(o.name, split)]
        from shardsmith.distill.sources import NEGATIVE_KEY, negative_record

        negative = None
        if s.guidance != 1.0:  # the negative prompt guidance took (as the ledger recorded it when the output began)
            negative = ctx.ledger.get_meta(NEGATIVE_KEY) or negative_record(ctx.recipe)
        index = kd_index(t_list=list(d.t_list), parameterisation=s.parameterisation, solver=s.solver, steps=s.steps,
                         rho=s.rho, guidance=s.guidance, negative_prompt=d.negative_prompt,
                         shape=list(d.shape) if d.shape else None,
                         dtype=o.dtype, has_path=o.path, seed=d.seed, teacher=desc.get("teacher"),
                         text=desc.get("text") if d.text == "encode" else {"source": "txt_emb.pth of each sample's "
                                                                          "source sample (distill.text: source)"},
                         samples=samples, negative=negative)
        atomic_write_json(dest / KD_INDEX_FILE, index)
        info["index"] = KD_INDEX_FILE
        info["path_timesteps"] = index["path_timesteps"]
        return info

    def warnings(self, o, ctx: OutputContext, files: dict[str, Any]) -> list[str]:
        desc = ctx.stage().describe()
        if "teacher" in desc.get("random_weights", []):
            return [f"output {o.name!r}: the teacher has RANDOM WEIGHTS: its trajectories check the plumbing "
                    "and are not a distillation target"]
        return []
