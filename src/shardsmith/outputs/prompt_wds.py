"""``format: prompt_wds``: prompt-only WebDataset shards for prompt-only distillation.

Every sample is one item's caption: ``<key>.txt`` and, with ``metadata``, ``<key>.json``; when
``models.text`` is set, also ``<key>.txt_emb.pth`` (``[L, D]`` in ``text_dtype``, the bytes
``latent_wds`` writes for the same caption) and ``neg_prompt_emb.npy`` (``negative_prompt``'s
float32 ``[L, D]``) beside the shards. Without ``models.text`` no model is loaded at all.

It needs neither ``models.vae`` nor ``geometry.buckets``. Items come from a captions-only table
(``columns: {caption: prompt}``: items of kind ``text``) or from any source with captions: an item
with media is taken for its caption (the media is not read). An item without a caption (or only
whitespace) is ``skipped:no_caption``. Read by the ``prompt`` loader preset.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from shardsmith import formats
from shardsmith.formats.wds import JSON, TXT
from shardsmith.outputs.base import OutputContext, OutputKind
from shardsmith.recipe import PromptWdsOutput
from shardsmith.records import NO_CAPTION, WRITTEN, PlannedItem, SampleResult, SourceInfo


class PromptSampleMaker:
    """Members ``txt`` (+ ``json``) of one prompt sample (picklable; runs in the worker processes).
    Opens no file: the caption was read at plan time."""

    def __init__(self, output: PromptWdsOutput, sources: list[SourceInfo]):
        self.o, self.sources = output, sources

    def __call__(self, item: PlannedItem) -> SampleResult:
        caption = item.caption
        if caption is None or not caption.strip():
            return SampleResult(idx=item.idx, status=f"skipped:{NO_CAPTION}",
                                detail=f"{item.item_id} has no caption, and output {self.o.name!r} ({self.o.format}) "
                                       "writes prompts only; give it a caption (columns.caption, or a sidecar "
                                       ".txt) or leave its source out of the output's sources:")
        members = {TXT: caption.encode("utf-8")}
        if self.o.metadata:
            src = self.sources[item.source]
            meta = {"id": item.item_id, "source": src.name, "path": item.relpath or None, "sha256": item.sha256,
                    "kind": item.kind, "label": item.label, "label_name": item.label_name, "license": src.license,
                    "origin": src.origin, "meta": item.meta}
            members[JSON] = json.dumps(meta, sort_keys=True, ensure_ascii=False).encode("utf-8")
        return SampleResult(idx=item.idx, status=WRITTEN, members=members)


class PromptWdsKind(OutputKind):
    format = "prompt_wds"
    model = PromptWdsOutput
    encoders = ("text",)  # only when models.text is set (encoders_for): else a CPU output, no model
    roles = ()  # the caption only
    preset = "prompt"

    def maker(self, o, ctx: OutputContext):
        return PromptSampleMaker(o, ctx.sources)

    def sink(self, o, ctx: OutputContext, dest: Path, split: str):
        from shardsmith.sinks.wds import WdsSink

        return WdsSink(o, dest)

    def renderer(self, o, ctx: OutputContext):
        if not self.encoders_for(o, ctx.recipe):
            return None
        from shardsmith.sinks.prompt_members import PromptMembers

        return PromptMembers(o)

    def finalize(self, o, ctx: OutputContext, sink, split: str, dest: Path) -> dict[str, Any]:
        info = super().finalize(o, ctx, sink, split, dest)
        if self.encoders_for(o, ctx.recipe):
            from shardsmith.formats.wds import NEG_PROMPT_SHA_KEY
            from shardsmith.sinks.latent_members import write_negative_prompt

            sha = write_negative_prompt(dest / formats.NEG_PROMPT_FILE, ctx.stage(), o.negative_prompt)
            info["neg_prompt_emb"] = formats.NEG_PROMPT_FILE
            info[NEG_PROMPT_SHA_KEY] = sha
        return info
