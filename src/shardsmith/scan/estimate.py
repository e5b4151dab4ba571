"""Estimated bytes on disk of each image output, from a sample run through the build's makers.

Contract: :func:`estimate_output` takes up to ``size_sample`` usable items of the output's
sources (the same items whatever the batch or thread count: the smallest sha256 of the item
id, then plan order), makes each sample with the output's own maker (a ZIP is
class-conditional when any item of its sources has a label, as in a build) and scales the
written share and mean size to the output's usable (train, holdout) counts with
:func:`shardsmith.safety.estimate.scale_sample`. It returns the report's block and the warnings
it found. ``video_wds`` and ``prompt_wds`` are estimated the same way from the items scan found
they write (:mod:`shardsmith.scan.takes`), at most ``VIDEO_SAMPLE`` clips made (each is
re-encoded); a ``prompt_wds`` with ``models.text`` adds each sample's ``txt_emb.pth`` (its size
depends only on the encoder's ``max_length`` x ``dim``) and ``neg_prompt_emb.npy``. ``latent_zip``
is not estimated (its sizes depend on the model), nor ``kd_wds`` (the teacher's samples).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from shardsmith.plan.ledger import Ledger
from shardsmith.recipe import PromptWdsOutput, Recipe, VideoWdsOutput, WdsOutput, ZipOutput
from shardsmith.records import WRITTEN, PlannedItem, SourceInfo
from shardsmith.safety.estimate import sample_bytes, scale_sample
from shardsmith.scan.format import human_bytes
from shardsmith.split.assign import HOLDOUT, TRAIN
from shardsmith.transform.samples import WdsSampleMaker, ZipSampleMaker

NOT_ESTIMATED = ("latent sizes depend on the model: run `shardsmith build ... --one-sample` "
                 "and look at that item's files")
KD_NOT_ESTIMATED = ("its samples are the teacher's (written by `shardsmith distill`): run `shardsmith distill ... "
                    "--preview N` to see some")
#: clips at most that the estimate of a video_wds output makes (each is decoded and re-encoded)
VIDEO_SAMPLE = 8


@dataclass
class OutputEstimate:
    block: dict[str, Any]  # the report's ``estimate[<output>]``
    warnings: list[str] = field(default_factory=list)


def _in(srcs: list[int]) -> str:
    return f"source IN ({','.join(str(int(s)) for s in srcs)})"


def _sample_rank(item_id: str) -> bytes:
    return hashlib.sha256(item_id.encode("utf-8")).digest()[:8]


def _sample(ledger: Ledger, srcs: list[int], k: int, pool: str = "usable",
            args: tuple = ()) -> list[PlannedItem]:
    """Up to ``k`` items of ``pool`` (a relation of ``items`` rows; ``args`` its parameters) of ``srcs``."""
    ledger.db.create_function("sample_rank", 1, _sample_rank, deterministic=True)
    idxs = [r[0] for r in ledger.db.execute(
        f"SELECT idx FROM {pool} WHERE {_in(srcs)} ORDER BY sample_rank(item_id), idx LIMIT ?", (*args, k))]
    return [next(ledger.items(idx_range=(i, i + 1))) for i in idxs]


#: the items an output writes, as scan decided (its ``results``): a relation taking the output's name
WRITTEN_BY = "(SELECT i.* FROM items i JOIN results r ON r.idx = i.idx AND r.output = ? WHERE r.status = 'written')"


def _made(o, maker, sample: list[PlannedItem], workers: int) -> tuple[list[int | None], Counter]:
    """Bytes of each sample ``maker`` makes (None where it would not be written) and the statuses
    of those it would not write."""
    sizes: list[int | None] = []
    skipped: Counter = Counter()
    if sample:
        with ThreadPoolExecutor(max_workers=min(len(sample), workers)) as pool:
            for it, res in zip(sample, pool.map(maker, sample)):
                written = res.status == WRITTEN
                sizes.append(sample_bytes(o, res.members or {}, it.key) if written else None)
                if not written:
                    skipped[res.status] += 1
    return sizes, skipped


def estimate_output(o, recipe: Recipe, ledger: Ledger, infos: list[SourceInfo], size_sample: int,
                    workers: int) -> OutputEstimate:
    """The report's estimate block for output ``o`` (see the module)."""
    if isinstance(o, (VideoWdsOutput, PromptWdsOutput)):
        return _shard_estimate(o, recipe, ledger, infos, size_sample, workers)
    if not isinstance(o, (WdsOutput, ZipOutput)):
        return OutputEstimate({"format": o.format, "not_estimated": KD_NOT_ESTIMATED if o.format == "kd_wds"
                               else NOT_ESTIMATED})
    db = ledger.db
    srcs = recipe.source_ids(o)
    per_split = dict(db.execute(f"SELECT split, COUNT(*) FROM usable WHERE {_in(srcs)} GROUP BY split"))
    counts = (per_split.get(TRAIN, 0), per_split.get(HOLDOUT, 0))
    usable = sum(counts)
    out = OutputEstimate({"format": o.format, "target": o.dir if isinstance(o, WdsOutput) else o.path,
                          "usable": usable, "sampled": 0, "written_in_sample": 0, "skipped_in_sample": {},
                          "samples": 0, "per_sample_bytes": 0, "bytes": 0, "human": human_bytes(0)})
    # as a build decides: a ZIP is class-conditional when any item of its sources has a label
    labelled = ledger.any_labelled(srcs)
    unlabelled = 0
    if isinstance(o, ZipOutput) and labelled:
        unlabelled = db.execute(f"SELECT COUNT(*) FROM usable WHERE label IS NULL AND label_name IS NULL "
                                f"AND {_in(srcs)}").fetchone()[0]
        if unlabelled:
            out.warnings.append(f"output {o.name}: {unlabelled} usable image(s) have no class label and this "
                                "ZIP is class-conditional; they would be skipped:no_label")

    sample = _sample(ledger, srcs, size_sample) if size_sample > 0 else []
    maker = WdsSampleMaker(o, recipe.images, infos) if isinstance(o, WdsOutput) else \
        ZipSampleMaker(o, recipe.images, infos, labelled)
    sizes, skipped = _made(o, maker, sample, workers)
    blk = out.block
    _record_sample(blk, sample, skipped)
    if sample:
        s = scale_sample(o, counts, sizes)
        blk.update(samples=sum(s.samples), per_sample_bytes=round(s.per_sample), bytes=round(s.total),
                   human=human_bytes(s.total))

    reported = {k: v for k, v in skipped.items() if not (unlabelled and k == "skipped:no_label")}
    if reported:
        by = ", ".join(f"{k} {v}" for k, v in skipped.most_common() if k in reported)
        out.warnings.append(f"output {o.name}: {sum(reported.values())} of {len(sample)} sampled image(s) would "
                            f"not be written ({by}); the estimate assumes the same share of all {usable} usable")
    elif usable == 0:
        out.warnings.append(f"output {o.name}: no usable image would be written")
    return out


class _WithEmbedding:
    """The prompt maker's sample plus a ``txt_emb.pth`` member of the size the text encoder's embedding takes."""

    def __init__(self, maker, nbytes: int):
        self.maker, self.nbytes = maker, nbytes

    def __call__(self, item: PlannedItem):
        from shardsmith.formats.wds import TEXT_EMB

        res = self.maker(item)
        if res.status == WRITTEN:
            res.members = {**res.members, TEXT_EMB: bytes(self.nbytes)}
        return res


def _shard_estimate(o, recipe: Recipe, ledger: Ledger, infos: list[SourceInfo], size_sample: int,
                    workers: int) -> OutputEstimate:
    """A ``video_wds`` / ``prompt_wds`` output: a sample of the items it writes, made by its own maker."""
    from shardsmith.outputs.base import OutputContext
    from shardsmith.outputs.registry import kind_of

    db = ledger.db
    srcs = recipe.source_ids(o)
    per_split = dict(db.execute(f"SELECT split, COUNT(*) FROM {WRITTEN_BY} WHERE {_in(srcs)} GROUP BY split",
                                (o.name,)))
    counts = (per_split.get(TRAIN, 0), per_split.get(HOLDOUT, 0))
    usable = sum(counts)
    out = OutputEstimate({"format": o.format, "target": o.dir, "usable": usable, "sampled": 0,
                          "written_in_sample": 0, "skipped_in_sample": {}, "samples": 0, "per_sample_bytes": 0,
                          "bytes": 0, "human": human_bytes(0)})
    k = min(size_sample, VIDEO_SAMPLE) if isinstance(o, VideoWdsOutput) else size_sample
    maker = kind_of(o).maker(o, OutputContext(recipe, None, ledger, infos, None))
    extra = 0
    if isinstance(o, PromptWdsOutput) and recipe.models.text is not None:
        from shardsmith.scan.latent_size import NPY_HEADER, _pth, text_shape

        shape = text_shape(recipe.models.text)
        if isinstance(shape, str):
            out.block["partial"] = [f"text embeddings not estimated: {shape}"]
        else:
            maker = _WithEmbedding(maker, _pth(shape, o.text_dtype))
            extra = NPY_HEADER + shape[0] * shape[1] * 4  # neg_prompt_emb.npy, float32
    sample = _sample(ledger, srcs, k, WRITTEN_BY, (o.name,)) if k > 0 else []
    sizes, skipped = _made(o, maker, sample, workers)
    blk = out.block
    _record_sample(blk, sample, skipped)
    if sample:
        s = scale_sample(o, counts, sizes)
        total = s.total + (extra if sum(s.samples) else 0)
        blk.update(samples=sum(s.samples), per_sample_bytes=round(s.per_sample), bytes=round(total),
                   human=human_bytes(total))
    if skipped:
        by = ", ".join(f"{k} {v}" for k, v in skipped.most_common())
        out.warnings.append(f"output {o.name}: {sum(skipped.values())} of {len(sample)} sampled item(s) would "
                            f"not be written when made ({by}); the estimate assumes the same share of all {usable}")
    return out


def _record_sample(blk: dict, sample: list, skipped) -> None:
    """An estimate's sample in its block: how many were made, written and skipped (``skipped``: a Counter)."""
    blk.update(sampled=len(sample), written_in_sample=len(sample) - sum(skipped.values()),
               skipped_in_sample=dict(skipped.most_common()))
