"""``decode``'s audio half: cached audio latents back to WAV files with the audio VAE the build recorded.

Contract
- :func:`audio_latents`: ``(sample path, latents [C, T, F], recorded duration or None)`` of one output's
  split, in the output's order: ``.precomputed/audio_latents/<rel>.pt`` (the LTX trainer's dicts) or
  the ``audio_latent.pth`` members of ``latent_wds`` shards (only the json and that member are read).
  Samples without audio have no entry.
- :func:`recorded_audio_vae`: the audio VAE rebuilt from the manifest's ``models.audio_vae`` and the
  recipe's (same family, config, pretrained, revision, dtype as the build: :func:`load_audio_vae`), with
  whether its weights are random. One without a vocoder cannot make waveforms: :class:`DecodeError`
  (raised before any file is written).
- :func:`check_recorded_weights`: a recorded ``pretrained`` model that is not on this machine (a local
  folder gone, a hub repo id not in the Hugging Face cache) is an error naming the key and the path,
  found on disk only (no download is tried), before any model loads.
- :func:`decode_audio_into`: each latent through the VAE decoder and the vocoder
  (:meth:`AudioVae.decode`: ``(4T - 3)`` mel frames, times the vocoder's upsampling) into
  ``<out>/<rel stem>.wav``, 16-bit PCM stereo at the vocoder's rate (:func:`wav_bytes`), mirroring the
  tree as the picture decode does. Each file's path is appended to the decode journal before the file
  is written (an interrupted decode's files stay removable by ``--overwrite``). One report row per WAV.
- :func:`audio_report`: the report's ``audio`` block (count, rate, random weights and the loud note).
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterator, TextIO

import torch

from shardsmith.errors import UserError
from shardsmith.formats import wds as wds_layout
from shardsmith.formats.precomputed import AUDIO_LATENTS
from shardsmith.verify.latent_records import latent_records
from shardsmith.atomic import atomic_write_bytes

WAV_EXT = ".wav"
RANDOM_NOTE = ("the audio VAE has RANDOM WEIGHTS: the sounds are meaningless and only prove the plumbing "
               "round-trips")


def audio_latents(root: Path, output: dict[str, Any], split: str,
                  find: Callable[[str, Any, str | None], tuple[str, Any]] | None = None,
                  damaged: list[dict[str, Any]] | None = None) -> Iterator[tuple[str, torch.Tensor, float | None]]:
    """(sample path, audio latents [C, T, F], duration in seconds or None) in the output's order; ``find``
    (``decode.Samples.find``): the sample's path from its record ``(rel, facts, key)``, as its pictures take
    (a ``latent_wds`` sample's media path with ``.pt`` is not unique: ``x.mp4`` and ``x.mov``); ``damaged``:
    where the records that cannot be read are listed (``latent_records``)."""
    for rel, z, facts, key in latent_records(root, output, split, AUDIO_LATENTS, wds_layout.AUDIO_LATENT, damaged):
        if find is not None:
            rel = find(rel, facts, key)[0]
        audio = facts.get("audio") if isinstance(facts.get("audio"), dict) else facts  # a sample's json: its audio
        duration = audio.get("duration")
        number = isinstance(duration, (int, float)) and not isinstance(duration, bool)
        yield rel, z, float(duration) if number else None


def check_recorded_weights(key: str, spec, error: type[UserError] = UserError) -> None:
    """``error`` naming ``key`` (``models.vae``) and the path when the pretrained weights the build recorded
    are not on this machine: a local folder that is gone, or a hub repo id that is not in the Hugging Face
    cache. Looked up on disk only, so a missing model never turns into a download attempt. Random
    weights (no ``pretrained``) are always there."""
    from shardsmith.encode.spec import resolve_model_folder

    if spec is None or spec.pretrained is None:
        return
    from shardsmith.precheck import local_path

    where = local_path(str(spec.pretrained))
    if resolve_model_folder(where, spec.subfolder, spec.revision)[0] is not None:
        return
    what = f"the weights this build recorded ({key}.pretrained {where}" + (
        f", {key}.subfolder {spec.subfolder})" if spec.subfolder else ")")
    if spec.subfolder and Path(where).exists():  # the folder is there, its subfolder is not
        raise error(f"{what} are missing: {where} has no {spec.subfolder}/ folder; put it back, then decode again")
    if Path(where).expanduser().is_absolute() or where.startswith((".", "~")):
        raise error(f"{what} are missing: {where} is not there; put the model folder back at {where} (or run "
                    "decode on the machine that has it), then decode again")
    raise error(f"{what} are missing: {where} is neither a folder here nor a repo in this machine's Hugging "
                f"Face cache; decode never downloads: fetch it first (huggingface-cli download {where}), or run "
                "decode where the weights are")


def recorded_audio_vae(manifest: dict[str, Any], recipe, device: str, error: type[UserError] = UserError):
    """(the recorded audio VAE, whether its weights are random); ``error`` when its recorded weights are
    missing (:func:`check_recorded_weights`, before loading) or it has no vocoder."""
    from shardsmith.encode.audio_vae import VOCODER_SUBFOLDER, load_audio_vae
    from shardsmith.precheck import local_path

    a = recipe.models.audio_vae
    check_recorded_weights("models.audio_vae", a, error)
    avae = load_audio_vae(a.family, pretrained=local_path(a.pretrained), subfolder=a.subfolder, revision=a.revision,
                          config=a.config, dtype=a.dtype, device=device)
    if avae.vocoder is None:
        raise error(f"the recorded audio VAE ({a.pretrained or a.config}) has no vocoder, so its latents cannot become "
                    f"sound: put the vocoder in {VOCODER_SUBFOLDER}/ beside the audio VAE's folder (as a diffusers "
                    "LTX-2 repo has it)")
    random = manifest["models"]["audio_vae"]["provenance"]["weights"] == "random-weights"
    return avae, random


def wav_path(out: Path, rel: str) -> Path:
    """Where the WAV of the sample stored under ``rel`` goes: ``out/<rel with .wav>``."""
    return out / PurePosixPath(rel).with_suffix(WAV_EXT)


def decode_audio_into(out: Path, avae, latents: Iterator[tuple[str, torch.Tensor, float | None]],
                      limit: int | None, journal: TextIO,
                      tick: Callable[[], Any] = lambda: None) -> list[dict[str, Any]]:
    """Decode up to ``limit`` audio latents into WAV files under ``out`` (each journalled first); one row each."""
    from shardsmith.encode.audio_vae import wav_bytes

    rows = []
    for i, (rel, z, duration) in enumerate(latents):
        if limit is not None and i >= limit:
            break
        wave, rate = avae.decode(z[None])
        target = wav_path(out, rel)
        journal.write(target.relative_to(out).as_posix() + "\n")
        journal.flush()  # recorded before the file exists: an interrupted decode's files stay ours
        atomic_write_bytes(target, wav_bytes(wave[0].numpy(), rate))
        rows.append({"path": rel, "file": target.relative_to(out).as_posix(), "latent_shape": list(z.shape),
                     "rate": rate, "samples": int(wave.shape[-1]), "seconds": round(wave.shape[-1] / rate, 6),
                     "latent_duration": duration})
        tick()
    return rows


def audio_report(rows: list[dict[str, Any]], avae, random: bool) -> dict[str, Any]:
    """The report's ``audio`` block: how many WAVs, their rate, and whether the weights are random."""
    return {"wavs": len(rows), "rate": avae.output_rate, "random_weights": random,
            "note": RANDOM_NOTE if random else None, "rows": rows}
