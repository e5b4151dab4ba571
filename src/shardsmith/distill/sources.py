"""What ``shardsmith distill`` takes from a ``kind: wds`` prompt source (a prompt_wds / latent_wds folder).

Contract
- ``teacher_input(item, folder, shape, text)``: the :class:`~shardsmith.records.TeacherInput` of one
  planned item: ``shape`` (``distill.shape``) or, unset, the shape of the item's ``latent.pth`` in its
  source; with ``text == "source"`` the item's ``txt_emb.pth`` as a float32 ``[L, D]`` tensor. A
  missing or unreadable member is an :class:`~shardsmith.records.ItemError`
  (``failed:no_latent_shape`` / ``failed:no_text_embedding``) naming the shard and key.
- ``check_sources(recipe)``: before anything runs, a :class:`DistillSourceError` (exit 2) when
  ``distill.text: source`` (or ``distill.shape`` unset) names a source that is not a WebDataset folder,
  when ``distill.shape`` is unset and a source holds several buckets (a FastGen batch has one shape), or
  when guidance needs a negative embedding and no source folder holds ``neg_prompt_emb.npy``.
- ``check_guidance(recipe)`` (called first by ``check_sources``, and by ``shardsmith distill`` before the
  build): a :class:`DistillSourceError` when ``distill.guidance`` is not a finite number of at most
  :data:`MAX_GUIDANCE` (``inf`` made every output NaN, written without a word).
- ``source_negative(recipe)``: ``(emb [L, D], None)`` from the first source folder holding
  ``neg_prompt_emb.npy``.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from shardsmith.errors import UserError
from shardsmith.formats.wds import LATENT, NEG_PROMPT_FILE, TEXT_EMB
from shardsmith.records import ItemError, PlannedItem, TeacherInput


class DistillSourceError(UserError):
    """A distill recipe whose sources cannot give what ``distill.text: source`` asks for."""


def _member(folder: str, item: PlannedItem, suffix: str):
    from shardsmith.loaders.pth_fast import load_pth_bytes
    from shardsmith.loaders.shard_reader import read_member

    ref = (item.meta.get("wds") or {}).get(suffix)
    if ref is None:
        return None
    shard = Path(folder) / item.meta["wds"]["shard"]
    fd = os.open(shard, os.O_RDONLY)
    try:
        return load_pth_bytes(read_member(fd, tuple(ref), item.relpath, writable=True))
    finally:
        os.close(fd)


def teacher_input(item: PlannedItem, folder: str, shape: list[int] | None, text: str) -> TeacherInput:
    if shape is None:
        try:
            latent = _member(folder, item, LATENT)
        except Exception as exc:  # noqa: BLE001 - a damaged member is this item's failure
            raise ItemError("no_latent_shape", f"{item.relpath}.{LATENT} cannot be read ({exc})") from None
        if latent is None:
            raise ItemError("no_latent_shape", f"{item.relpath} has no {LATENT} to take the sample shape from; set "
                                               "distill.shape or read prompts from a latent_wds source")
        shape = list(latent.shape)
    emb = None
    if text == "source":
        try:
            emb = _member(folder, item, TEXT_EMB)
        except Exception as exc:  # noqa: BLE001
            raise ItemError("no_text_embedding", f"{item.relpath}.{TEXT_EMB} cannot be read ({exc})") from None
        if emb is None:
            raise ItemError("no_text_embedding", f"{item.relpath} has no {TEXT_EMB} (distill.text: source); build the "
                                                 "source with models.text, or use distill.text: encode")
        emb = emb.float()
    return TeacherInput(tuple(int(d) for d in shape), emb)


def _wds_folders(recipe) -> list[tuple[str, Path | None]]:
    from shardsmith.sources.base import is_shard_folder

    out = []
    for s in recipe.sources:
        p = Path(s.path)
        wds = s.kind == "wds" or (s.kind == "auto" and p.is_dir() and is_shard_folder(p))
        out.append((s.name, p if wds else None))
    return out


#: the largest classifier-free guidance scale taken (the scales in use run from 1 to about 20); a larger one
#: only amplifies the teacher's noise, up to inf and NaN outputs
MAX_GUIDANCE = 1000.0


def check_guidance(recipe) -> None:
    d = recipe.distill
    if d is None:
        return
    w = d.guidance
    if not (isinstance(w, (int, float)) and math.isfinite(w) and 0 <= w <= MAX_GUIDANCE):
        raise DistillSourceError(f"distill.guidance {w} (--guidance) must be a finite number from 0 to "
                                 f"{MAX_GUIDANCE:g}: each sample is u + w (c - u), which an infinite or huge "
                                 "w turns into NaN or inf; use 1 (the conditional model alone) or a scale such as 2-8")


def check_sources(recipe) -> None:
    d = recipe.distill
    if d is None:
        return
    check_guidance(recipe)
    folders = _wds_folders(recipe)
    if d.shape is None:
        from shardsmith.formats.wds import read_buckets_index

        for name, folder in folders:
            if folder is None:
                raise DistillSourceError(f"distill.shape is unset, and source {name!r} is not a latent_wds folder "
                                         "whose latent.pth could give each sample's shape; set distill.shape (e.g. "
                                         "[4, 32, 32]) or read prompts from a latent_wds folder")
            buckets = read_buckets_index(folder)
            if buckets and len(buckets) > 1:
                raise DistillSourceError(f"distill.shape is unset, and source {name!r} holds {len(buckets)} buckets "
                                         f"({', '.join(buckets)}): a FastGen batch has one shape; give one bucket's "
                                         f"folder per distill recipe (e.g. path: {folder / next(iter(buckets))}) or set "
                                         "distill.shape")
    if d.text != "source":
        return
    for name, folder in folders:
        if folder is None:
            raise DistillSourceError(f"distill.text is source, but source {name!r} is not a WebDataset folder of "
                                     "prompt_wds / latent_wds shards (its samples' txt_emb.pth are the embeddings); "
                                     "use such a folder, or distill.text: encode with models.text")
    from shardsmith.sources.wds import negative_file

    if d.guidance != 1.0 and not any(negative_file(f) is not None for _, f in folders):
        raise DistillSourceError(f"distill.guidance {d.guidance:g} needs the negative prompt's embedding, and with "
                                 f"distill.text: source no source folder holds {NEG_PROMPT_FILE}; build the source "
                                 "with a negative_prompt (prompt_wds / latent_wds write it), or set distill.guidance: 1, "
                                 "or use distill.text: encode")


def source_negative(recipe):
    from shardsmith.sources.wds import negative_embedding

    for _, folder in _wds_folders(recipe):
        if folder is not None:
            emb = negative_embedding(folder)
            if emb is not None:
                return emb, None
    raise DistillSourceError(f"no source folder holds {NEG_PROMPT_FILE} for classifier-free guidance")
