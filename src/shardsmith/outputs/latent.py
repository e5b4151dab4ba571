"""What the latent outputs share: the pixel maker in the recipe's buckets and the member renderer."""

from __future__ import annotations

from shardsmith.outputs.base import OutputContext, OutputKind


def audio_cutter(o, recipe):
    """The audio settings of output ``o``'s sample maker: the audio encoder's rate (from its config,
    no model loaded), whether audio is required and the duration buckets; None when ``o`` writes no audio."""
    if not any(a is o for a in recipe.audio_outputs()):
        return None
    from shardsmith.encode.audio_vae import audio_vae_settings
    from shardsmith.transform.audio_samples import AudioCutter

    a = recipe.models.audio_vae
    settings = audio_vae_settings(a.family, pretrained=a.pretrained, subfolder=a.subfolder, revision=a.revision,
                                  config=a.config)
    durations = tuple(recipe.audio.durations) if recipe.audio.durations else None
    return AudioCutter(settings.sample_rate, recipe.audio_required, durations,
                       reference=recipe.mode in ("av2av-ic", "a2a-ic"), resampler=recipe.audio.resampler)


def partner_cutter(recipe):
    """The partners the recipe's ``mode`` gives each latent sample (a reference, a source, the first
    frame), or None."""
    from shardsmith.transform.partners import MODE_PARTNERS, PartnerCutter

    names = MODE_PARTNERS.get(recipe.mode or "")
    g = recipe.geometry
    return PartnerCutter(names, recipe.images.max_pixels, g.reference_downscale_factor,
                         g.reference_temporal_scale_factor) if names else None


def condition_cutter(recipe):
    """The arrays the recipe's ``mode`` gives each latent sample as they are (a mask on the VAE's latent
    grid, camera rows), or None; the VAE's compression comes from its config (no model loaded)."""
    from shardsmith.transform.partners import MODE_CONDITIONS, ConditionCutter

    names = MODE_CONDITIONS.get(recipe.mode or "")
    if not names:
        return None
    spatial, temporal = 8, 1
    v = recipe.models.vae
    if v is not None:
        from shardsmith.encode.vae_config import geometry

        geo = geometry(v.family, v.config, pretrained=v.pretrained, subfolder=v.subfolder, revision=v.revision)
        if geo is not None:
            spatial, temporal = geo["spatial"], geo["temporal"]
    audio = None
    if "audio_mask" in names and recipe.models.audio_vae is not None:
        from shardsmith.encode.audio_vae import audio_vae_settings

        a = recipe.models.audio_vae
        audio = audio_vae_settings(a.family, pretrained=a.pretrained, subfolder=a.subfolder, revision=a.revision,
                                   config=a.config)
    return ConditionCutter(names, spatial, temporal, audio)


AUDIO_CHECKED_CLIPS = 32  # clips of an output without audio probed for an audio track it drops


def unencoded_audio(o, ctx: OutputContext) -> list[str]:
    """A warning when ``o`` writes no audio (no ``models.audio_vae``, no ``--skip-audio``) while its
    clips carry audio tracks (the first :data:`AUDIO_CHECKED_CLIPS` written clips are probed): a
    dropped audio track is said, never silent."""
    r = ctx.recipe
    if r.audio.skip or any(a is o for a in r.audio_outputs()):
        return []
    from shardsmith.records import ItemError
    from shardsmith.transform.audio import probe_audio

    checked = with_audio = 0
    for split in ("train", "holdout"):
        for item in ctx.ledger.items(split=split, sources=r.source_ids(o), status="ok"):
            if checked >= AUDIO_CHECKED_CLIPS:
                break
            if item.kind != "video":
                continue
            checked += 1
            try:
                probe_audio(item.path, item.item_id)
                with_audio += 1
            except ItemError:
                pass
    if not with_audio:
        return []
    return [f"{o.name}: {with_audio} of the {checked} clip(s) checked carry an audio track that no output encodes "
            "(no audio latents were written); set models.audio_vae (e.g. {family: ltx2_audio}) to write them, or "
            "pass --skip-audio (audio.skip: true) to say the audio is not wanted"]


class LatentKind(OutputKind):
    encoders = ("vae", "text", "audio_vae")  # each only when the recipe sets it (encoders_for)

    def maker(self, o, ctx: OutputContext):
        from shardsmith.encode.decoder_choice import settled
        from shardsmith.transform.buckets import parse_buckets
        from shardsmith.transform.latent_pixels import LatentPixelMaker

        r = ctx.recipe
        buckets = parse_buckets(r.geometry.buckets) if r.geometry.buckets else []  # none: an audio-only dataset
        return LatentPixelMaker(buckets, r.images, r.geometry.fps,
                                audio=audio_cutter(o, r), partners=partner_cutter(r), conditions=condition_cutter(r),
                                decoder=settled(r.images.decoder))

    def warnings(self, o, ctx: OutputContext, files: dict) -> list[str]:
        return unencoded_audio(o, ctx)

    def renderer(self, o, ctx: OutputContext):
        from shardsmith.sinks.latent_members import LatentMembers

        return LatentMembers(o, ctx.sources, multi_source=len(ctx.recipe.source_ids(o)) > 1)
