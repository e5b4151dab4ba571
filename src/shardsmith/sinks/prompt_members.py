"""The text-embedding member of a ``prompt_wds`` sample, rendered once its caption is encoded.

Members of a sample with a text encoder (``models.text``), in this order: ``txt`` (the prompt,
UTF-8, from the sample maker), ``txt_emb.pth`` (``torch.save`` of the ``[L, D]`` embedding in the
output's ``text_dtype``, the bytes ``latent_wds`` writes for the same caption) and, with
``metadata``, ``json`` (the maker's, plus ``models``: the text encoder's family, weights and path).
"""

from __future__ import annotations

import json

from shardsmith.formats.wds import JSON, TEXT_EMB, TXT
from shardsmith.records import PlannedItem, SampleResult
from shardsmith.sinks.latent_members import _DTYPES, _pth_size
from shardsmith.sinks.precomputed import pt_bytes


class PromptMembers:
    """The members of one ``prompt_wds`` output's samples (a
    :class:`~shardsmith.encode.finisher.MemberRenderer` for batches without pixels)."""

    def __init__(self, output):
        self.o = output
        self.models: dict[str, dict] = {}  # the text encoder's family, weights and path (start())

    def start(self, stage) -> None:
        """Take the text encoder's identity from the encode stage, once, before its first batch."""
        self.models = {k: {"family": v["spec"]["family"], "weights": v["provenance"]["weights"],
                           "path_or_repo": v["provenance"].get("path_or_repo")}
                       for k, v in stage.describe().items() if k == "text"}

    def render(self, batch: list[tuple[PlannedItem, SampleResult]], z, texts) -> None:
        """Add each item's ``txt_emb.pth`` (``texts[i][0]``, ``[L, D]``) to the maker's members;
        ``z`` (latents) is None here: these batches have no pixels."""
        if texts is None:
            raise RuntimeError("prompt_wds: a batch came back without text embeddings (models.text is unset)")
        for (item, res), (emb, *_rest) in zip(batch, texts):
            res.members = self._members(res.members, pt_bytes(emb.to(_DTYPES[self.o.text_dtype]).contiguous()))
            res.pixels = None

    def _members(self, made: dict[str, bytes], emb: bytes) -> dict[str, bytes]:
        out = {TXT: made[TXT], TEXT_EMB: emb}
        if JSON in made:
            out[JSON] = self._json(made[JSON])
        return out

    def _json(self, made: bytes) -> bytes:
        meta = json.loads(made)
        meta["models"] = self.models
        return json.dumps(meta, sort_keys=True, ensure_ascii=False).encode("utf-8")

    def sizes(self, item: PlannedItem, res: SampleResult, stage) -> list[tuple[str, int]]:
        """``(suffix, bytes)`` of the members the sample will have, exactly, before it is encoded."""
        if not self.models:
            self.start(stage)
        ts = stage.text_encoder.spec
        out = [(TXT, len(res.members[TXT])), (TEXT_EMB, _pth_size((ts.max_length, ts.dim), self.o.text_dtype))]
        if JSON in res.members:
            out.append((JSON, len(self._json(res.members[JSON]))))
        return out

