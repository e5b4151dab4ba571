"""``format: latent_wds``: WebDataset shards of cached latents and text embeddings (FastGen's
latent loaders), with ``neg_prompt_emb.npy`` beside them. With several buckets in
``geometry.buckets`` (or several ``audio.durations`` of an audio-only dataset: ``audio_<ms>ms/``) the output is
one WebDataset folder per bucket plus ``buckets.json``
(:mod:`shardsmith.sinks.bucketed_wds`): every batch of one folder has one shape."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardsmith import formats
from shardsmith.outputs.base import OutputContext
from shardsmith.outputs.latent import LatentKind
from shardsmith.recipe import LatentWdsOutput


def audio_buckets(recipe) -> bool:
    """Whether the recipe is an audio-only dataset (no VAE, an audio VAE) cut to several ``audio.durations``:
    its latent outputs' samples then have one latent shape per duration."""
    m = recipe.models
    return m.vae is None and m.audio_vae is not None and len(recipe.audio.durations or []) > 1


def bucketed(ctx: OutputContext) -> bool:
    """Whether the recipe's latent outputs are written one folder per bucket: several buckets in
    ``geometry.buckets``, or several audio durations of an audio-only dataset."""
    return len(ctx.recipe.geometry.buckets or []) > 1 or audio_buckets(ctx.recipe)


def latent_shapes(ctx: OutputContext) -> dict[str, list[int]]:
    """The latent shape (no batch) of every bucket of the recipe, from the loaded encoder: the VAE's per
    geometry bucket; an audio-only dataset's, ``audio_latent.pth``'s ``[C, T, F]`` per duration."""
    from shardsmith.transform.buckets import parse_buckets

    stage = ctx.stage()
    vae = stage.vae
    if vae is None:  # an audio-only dataset: its durations' shapes, where it has duration buckets
        audio, durations = stage.audio_vae, ctx.recipe.audio.durations
        if audio is None or not durations:
            return {}
        from shardsmith.formats.wds import audio_bucket
        from shardsmith.transform.audio import num_samples

        rate = audio.settings.sample_rate
        return {audio_bucket(d): list(audio.settings.latent_shape(num_samples(d, rate))) for d in durations}
    spec, out = vae.spec, {}
    for b in parse_buckets(ctx.recipe.geometry.buckets):
        pixel = (3, b.height, b.width) if spec.kind == "image_vae" else (3, b.frames, b.height, b.width)
        out[str(b)] = list(spec.latent_shape(pixel))
    return out


class LatentWdsKind(LatentKind):
    format = "latent_wds"
    model = LatentWdsOutput
    preset = "image_latent"

    def sink(self, o, ctx: OutputContext, dest: Path, split: str):
        if bucketed(ctx):
            from shardsmith.sinks.bucketed_wds import BucketedWdsSink

            return BucketedWdsSink(o, dest)
        from shardsmith.sinks.wds import WdsSink

        return WdsSink(o, dest)

    def finalize(self, o, ctx: OutputContext, sink, split: str, dest: Path) -> dict[str, Any]:
        if bucketed(ctx):
            info = sink.finalize(ctx.ledger.unit_files(o.name, split), latent_shapes(ctx))
        else:
            info = super().finalize(o, ctx, sink, split, dest)
        stage = ctx.stage()
        if stage.text_encoder is not None:
            from shardsmith.formats.wds import NEG_PROMPT_SHA_KEY
            from shardsmith.sinks.latent_members import write_negative_prompt

            sha = write_negative_prompt(dest / formats.NEG_PROMPT_FILE, stage, o.negative_prompt)
            info["neg_prompt_emb"] = formats.NEG_PROMPT_FILE
            info[NEG_PROMPT_SHA_KEY] = sha
        return info
