"""The audio half of a latent sample: one item -> its processed waveform for the audio encoder.

Runs in worker processes (picklable), beside :class:`~shardsmith.transform.latent_pixels.LatentPixelMaker`.

Contract of :class:`AudioCutter` (settings: the encoder's sample ``rate``, whether audio is
``required``, the ``durations`` buckets of audio-only items, the ``resampler``):

- The waveform (:class:`~shardsmith.records.Waveform`) is float32. With ``resampler="sinc"`` (LTX-2's
  order) the window is cut at the source's own rate, a mono source stays mono, and the encoder duplicates
  and resamples it (:mod:`shardsmith.encode.resample`; a rate its kernel cannot take is resampled here by
  FFmpeg); with ``"ffmpeg"`` FFmpeg resamples it here to ``rate`` before the cut.

- ``for_clip(item, geom, pr)``: the audio of a video sample, cut to the clip as actually sampled:
  it starts at the time of the first chosen source frame and lasts the bucket's frames ÷ the
  sample's fps (:func:`~shardsmith.transform.audio.clip_window`). It comes from the item's
  ``audio`` partner when it has one (``columns.audio``), else from the clip's own audio stream.
  Returns ``(Waveform, info)``.
- ``for_file(item)``: an audio-only item (an audio file as the target): the largest duration bucket
  not longer than the file (``skipped:too_short`` naming its duration when it is shorter than every
  bucket), or the whole file without buckets; cut from the start.
- Without audio (no stream, an image, a decode error): with ``required`` the item fails
  (``failed:no_audio_stream`` / ``failed:audio_decode_error``, the detail names the file, FFmpeg's
  message and the fix); without, the sample has no audio and ``info["status"]`` says why. So does a window
  that decoded but cannot be encoded (:func:`~shardsmith.transform.audio.check_decoded`):
  ``audio_not_finite`` (NaN or infinite samples, which would give latents of NaN) and
  ``audio_rate_too_low`` (a source below ``MIN_AUDIO_RATE`` Hz, or a window holding no sample).
- ``info`` (``SampleResult.info["audio"]``): ``status`` (``written``, or the reason there is none),
  ``duration`` / ``start`` (seconds: the window), ``recorded_duration`` (what ``audio_latents/`` records:
  LTX-2's cut samples ÷ their rate with ``sinc``, the window with ``ffmpeg``), ``samples`` (what the encoder
  takes, at ``rate``: the encoder's), ``cut_rate`` / ``cut_samples`` (the waveform as cut),
  ``resampled_by`` (``encoder``, ``ffmpeg`` or ``none``), the source's ``source_rate`` /
  ``source_channels`` / ``layout``, ``padded`` (seconds of silence added at the end) and, from an
  audio partner, ``partner``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shardsmith.records import TARGET, ItemError, MediaRef, PlannedItem, Waveform
from shardsmith.transform.audio import (DecodedAudio, check_decoded, choose_duration, clip_window, decode_audio,
                                        probe_audio, resampled_length)
from shardsmith.transform.geometry import Geometry

AUDIO_ROLE = "audio"
#: an audio-only item whose waveform lasts at most this (seconds) decodes in milliseconds: the worker pool
#: sends it in a chunk with others (``LatentPixelMaker.is_heavy``)
LIGHT_AUDIO_S = 10.0
#: ... and carries at most this many samples (all channels) as its cutter sends it: 10 s of 48 kHz stereo (a
#: 192 kHz recording cut to 8 s is 6 MB a channel: it travels alone, so a chunk stays a few tens of MB)
LIGHT_AUDIO_SAMPLES = int(LIGHT_AUDIO_S * 48000 * 2)


def planned_duration(item: PlannedItem) -> float | None:
    """The plan's probe of an audio-only item's duration (seconds); None where the plan has none for it."""
    target = item.media.get("target")
    facts = target.audio if target is not None else None
    return float(facts["duration"]) if facts is not None and "duration" in facts else None


def audio_seconds(item: PlannedItem, cutter: "AudioCutter | None") -> float:
    """The seconds of audio :meth:`AudioCutter.for_file` will decode for the audio-only ``item``, from the
    plan's probe: its duration bucket, 0.0 when it is shorter than every bucket (skipped undecoded), the
    whole file without buckets; infinite when the plan gave no duration or there is no cutter."""
    duration = planned_duration(item)
    if cutter is None or duration is None:
        return float("inf")
    if not cutter.durations:
        return duration
    chosen = choose_duration(duration, cutter.durations)
    return 0.0 if chosen is None else chosen


def travels_light(item: PlannedItem, cutter: "AudioCutter | None") -> bool:
    """Whether the audio-only ``item`` goes to the decode workers in a chunk: its waveform (from the plan's
    probe) lasts at most :data:`LIGHT_AUDIO_S` and holds at most :data:`LIGHT_AUDIO_SAMPLES` samples as
    ``cutter`` sends it (:meth:`AudioCutter.sent_rate_channels`)."""
    seconds = audio_seconds(item, cutter)
    if seconds > LIGHT_AUDIO_S:
        return False
    rate, channels = cutter.sent_rate_channels(item.media["target"].audio)
    return seconds * rate * channels <= LIGHT_AUDIO_SAMPLES


def _facts(ref: MediaRef | None) -> dict[str, Any] | None:
    """The plan's probe facts of ``ref``'s audio stream, when there are any."""
    return None if ref is None else ref.audio


@dataclass(frozen=True)
class AudioCutter:
    rate: int
    required: bool = True
    durations: tuple[float, ...] | None = None
    reference: bool = False  # IC-LoRA with audio (av2av-ic, a2a-ic): the reference's audio too
    resampler: str = "sinc"  # audio.resampler: sinc (the encoder resamples) or ffmpeg (resampled here)

    def sent_rate_channels(self, facts: dict[str, Any]) -> tuple[int, int]:
        """``(rate, channels)`` of the waveform this cutter sends for a source the plan probed as ``facts``."""
        from shardsmith.encode.resample import fits

        rate, channels = int(facts.get("rate") or 0), int(facts.get("channels") or 0)
        if self.resampler == "sinc" and rate > 0 and fits(rate, self.rate):
            return rate, 1 if channels == 1 else 2
        return self.rate, 2

    def decode(self, path: str, name: str, start: float, duration: float | None,
               probed: dict[str, Any] | None = None) -> DecodedAudio:
        """The window ``[start, start + duration)`` (None: to the end), cut as ``resampler`` says: at the
        source's rate with ``sinc`` (mono kept), at ``rate`` with ``ffmpeg``. With ``sinc``, a file whose
        rate the encoder's kernel cannot take (:func:`~shardsmith.encode.resample.fits`: a rate sharing
        almost no factor with the encoder's, such as 22,254 Hz) is resampled here by FFmpeg instead (its
        info says ``resampled_by: ffmpeg``). ``probed``: the plan's probe facts of the file, when known; a rate
        they show unfit goes to FFmpeg at once (not decoded twice)."""
        if self.resampler == "sinc":
            from shardsmith.encode.resample import fits

            rate = int((probed or {}).get("rate") or 0)
            if not rate or fits(rate, self.rate):
                dec = decode_audio(path, name, rate=None, start=start, duration=duration, keep_mono=True)
                if fits(dec.rate, self.rate):
                    return dec
        return decode_audio(path, name, rate=self.rate, start=start, duration=duration)

    def for_reference(self, item: PlannedItem, target: dict[str, Any]) -> tuple[Waveform | None, dict[str, Any]]:
        """The ``reference`` partner's audio over the very window the target's was cut to (``target``: the
        target's ``info["audio"]``), for ``reference_audio_latents/``: a clip's audio stream or an audio
        file. Without it the item fails (``failed:reference_no_audio_stream`` ...) when audio is required."""
        ref = item.media.get("reference")
        if ref is None or target.get("status") != "written":
            return None, {"status": "none"}
        name = f"{item.item_id} (its reference {ref.relpath})"
        if ref.kind == "audio":  # (a clip's bytes were checked with its pixels: transform.partners)
            from shardsmith.transform.partners import planned_bytes

            planned_bytes(item, "reference")  # failed:reference_changed_since_plan, reference_vanished ...
        try:
            dec = check_decoded(self.decode(ref.path, name, target["start"], target["duration"], ref.audio), name,
                                target["duration"])
        except ItemError as err:
            return self._missing(item, ItemError(f"reference_{err.reason}", err.detail))
        return Waveform(dec.wave, dec.rate), self._info(dec, target["start"], target["duration"])

    def _missing(self, item: PlannedItem, err: ItemError) -> tuple[None, dict[str, Any]]:
        """No audio for ``item``: the item fails when audio is required, else the sample goes without."""
        if self.required:
            raise ItemError(err.reason, err.detail)  # failed (never skipped): an audio loss is loud
        return None, {"status": f"failed:{err.reason}", "detail": err.detail}

    def _info(self, dec: DecodedAudio, start: float, duration: float) -> dict[str, Any]:
        cut = int(dec.wave.shape[-1])
        # the audio_latents record's duration: LTX-2's (the samples cut at the source's rate over that rate) with
        # sinc; the window's with ffmpeg, as builds stored it before
        recorded = cut / dec.rate if self.resampler == "sinc" else duration
        by = "encoder" if dec.rate != self.rate else "ffmpeg" if dec.probe.rate != self.rate else "none"
        return {"status": "written", "duration": duration, "start": start, "recorded_duration": recorded,
                "resampled_by": by, "samples": resampled_length(cut, dec.rate, self.rate), "rate": self.rate,
                "cut_rate": dec.rate, "cut_samples": cut, "source_rate": dec.probe.rate,
                "source_channels": dec.probe.channels, "layout": dec.probe.layout, "padded": dec.padded}

    def for_clip(self, item: PlannedItem, geom: Geometry, source_fps: float) -> tuple[Waveform | None, dict[str, Any]]:
        """The audio matching a video sample whose geometry is ``geom`` (see the module contract)."""
        partner = item.media.get(AUDIO_ROLE)
        path = partner.path if partner is not None else item.path
        probed = _facts(partner or item.media.get(TARGET))
        name = f"{item.item_id} (its audio {partner.relpath})" if partner is not None else item.item_id
        first = geom.frame_indices[0] if geom.frame_indices else 0
        start, duration = clip_window(first, source_fps, geom.bucket.frames, geom.fps)
        if partner is not None:  # its bytes as planned (as every partner's), whatever audio.required says: never
            from shardsmith.transform.partners import planned_bytes  # another file's sound under this clip

            planned_bytes(item, AUDIO_ROLE)  # failed:audio_changed_since_plan, audio_vanished ...
        try:
            dec = check_decoded(self.decode(path, name, start, duration, probed),
                                name if partner is not None else f"{name} ({item.relpath})", duration)
        except ItemError as err:
            return self._missing(item, err)
        info = self._info(dec, start, duration)
        if partner is not None:
            info["partner"] = partner.relpath
        return Waveform(dec.wave, dec.rate), info

    def for_image(self, item: PlannedItem) -> tuple[None, dict[str, Any]]:
        """An image has no audio: failed when audio is required (an image in an audio dataset)."""
        return self._missing(item, ItemError("no_audio_stream", f"{item.item_id} is an image and has no audio; "
                                             "keep images out of datasets with audio (limit the output's "
                                             "sources:), or set audio.required: false"))

    def for_file(self, item: PlannedItem) -> tuple[Waveform | None, dict[str, Any]]:
        """An audio-only item's waveform (see the module contract). The file's duration is the plan's
        probe of it (the caller has checked that the bytes are the planned ones), probed again only
        where the plan has none or found no audio (whose error then names the reason)."""
        duration = planned_duration(item)
        if duration is None:
            try:
                duration = probe_audio(item.path, item.item_id).duration
            except ItemError as err:
                return self._missing(item, err)
        if self.durations:
            chosen = choose_duration(duration, self.durations)
            if chosen is None:
                raise ItemError("too_short", f"{item.item_id} lasts {duration:.3f} s, shorter than the "
                                f"smallest audio duration bucket ({min(self.durations):g} s); add a shorter one to "
                                "audio.durations (--audio-durations) to keep it", skip=True)
            duration = chosen
        try:
            dec = check_decoded(self.decode(item.path, item.item_id, 0.0, duration, _facts(item.media.get(TARGET))),
                                f"{item.item_id} ({item.relpath})", duration)
        except ItemError as err:
            return self._missing(item, err)
        return Waveform(dec.wave, dec.rate), self._info(dec, 0.0, duration)
