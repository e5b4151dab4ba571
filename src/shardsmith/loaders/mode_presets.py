"""The loader presets of the recipe's modes (issue 18): what a loader of a mode's dataset reads.

A recipe's ``mode`` (``recipe.MODE_ROLES``) gives its samples partner members (``formats.wds``:
``ref_latent.pth``, ``ref_audio_latent.pth``, ``src_latent.pth``, ``first_frame_latent.pth``,
``mask.pth``, ``audio_mask.pth``, ``camera.npy``, ``audio_latent.pth``; ``src.jpg`` in a raw ``wds`` edit pair). Their ``key_map`` lives here, once:

- :data:`MODE_KEY_MAPS`: mode -> the ``key_map`` of its ``latent_wds`` samples, built with
  ``models.text`` (``condition``), with audio where the mode has it; :func:`mode_key_map` drops
  ``condition`` for a build without a text encoder, adds ``audio`` where the build wrote audio for every
  sample, drops it where it wrote none. The audio-only modes (t2a, audio-inpaint, a2a-ic) read their
  audio latents as ``real`` (a2a-ic's reference: the reference's audio latents).
- :data:`RAW_MODE_KEY_MAPS`: the same for the raw ``wds`` output (the image modes).
- :data:`MODE_PRESETS`: preset name -> :class:`ModePreset` (mode, format, FastGen preset, defaults,
  note, gap), one per mode and format (``latent_v2v_ic``, ``image_edit``, ...; a raw t2i set is the
  ``image`` preset); ``loaders.presets`` adds them to ``PRESETS``, which ``verify --preset`` and
  ``register`` take. ``gap`` (:func:`fastgen_gap`): why FastGen v0.1.0 has no config for the mode
  (``register`` prints it as a comment line of the config).
- :func:`build_facts`: the mode, format, text encoder and audio of the shardsmith build that wrote
  a dataset, from that build's ``manifest.json`` (its recorded recipe); :func:`folder_facts` the
  same guessed from the folder when no manifest names it; :func:`mode_preset_for` the preset
  ``verify`` and ``register`` pick for a dataset by themselves; :func:`kd_preset_for` the one
  ``verify`` picks for a knowledge-distillation dataset (``kd_wds``, no mode: ``kd_path`` / ``kd_pair``).

Imports ``formats`` only (no torch): ``verify`` and the CLI read it before any loader starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardsmith.atomic import read_json
from shardsmith.formats.build_dir import MANIFEST_FILE
from shardsmith.formats.detect import enclosing_build
from shardsmith.formats.wds import (AUDIO_LATENT, AUDIO_MASK, BUCKETS_INDEX_FILE, CAMERA, FIRST_FRAME_LATENT, JPG, LATENT, MASK,
                                    NEG_PROMPT_FILE, REF_AUDIO_LATENT, REF_LATENT, SRC_LATENT, TEXT_EMB, TXT,
                                    source_member)

LATENT_WDS, WDS = "latent_wds", "wds"

#: the batch key of the text embeddings, dropped for a build without ``models.text``
CONDITION = "condition"
#: the batch key of the audio latents beside a video latent
AUDIO = "audio"
#: the batch key of the reference's audio latents beside its video latents (av2av-ic)
REFERENCE_AUDIO = "reference_audio"

#: modes whose only latent is the audio's: ``real`` is ``audio_latent.pth``
AUDIO_ONLY_MODES = ("t2a", "audio-inpaint", "a2a-ic")
#: modes whose dataset is audio plus video (the audio is the point of them)
AUDIO_VIDEO_MODES = ("a2v", "v2a", "av2av-ic")
#: modes of stills (FastGen's image presets: batch 32)
IMAGE_MODES = ("t2i", "image-edit")

_T = {"real": LATENT, CONDITION: TEXT_EMB}
_A = {"real": AUDIO_LATENT, CONDITION: TEXT_EMB}

#: mode -> the key_map of its ``latent_wds`` samples (built with ``models.text``; audio: :func:`mode_key_map`)
MODE_KEY_MAPS: dict[str, dict[str, str]] = {
    "t2i": dict(_T),
    "t2v": dict(_T),
    "i2v": {**_T, "first_frame": FIRST_FRAME_LATENT},
    "v2v-ic": {**_T, "reference": REF_LATENT},
    "a2v": {**_T, AUDIO: AUDIO_LATENT},
    "v2a": {**_T, AUDIO: AUDIO_LATENT},
    "t2a": dict(_A),
    "video-inpaint": {**_T, "mask": MASK},
    "audio-inpaint": {**_A, "mask": AUDIO_MASK},
    "av2av-ic": {**_T, "reference": REF_LATENT, AUDIO: AUDIO_LATENT, REFERENCE_AUDIO: REF_AUDIO_LATENT},
    "a2a-ic": {**_A, "reference": REF_AUDIO_LATENT},
    "image-edit": {**_T, "source": SRC_LATENT},
    "camera-video": {**_T, "camera": CAMERA},
}

#: mode -> the key_map of its raw ``wds`` samples (``jpg`` here: :func:`mode_key_map` follows the
#: output's image format)
RAW_MODE_KEY_MAPS: dict[str, dict[str, str]] = {
    "t2i": {"real": JPG, CONDITION: TXT},
    "image-edit": {"real": JPG, "source": source_member(JPG), CONDITION: TXT},
}

_NO_AUDIO = ("it reads no audio (v0.2.0's VideoAudioLoaderConfig is not public); audio is each clip's audio latents "
             "[C, T, F]")
#: mode -> why FastGen v0.1.0 has no config for it (None: one of its configs reads it as it is);
#: ``register`` prints "FastGen v0.1.0 has no config for mode <mode>: <gap>"
FASTGEN_GAPS: dict[str, str | None] = {
    "t2i": None,
    "t2v": None,
    "i2v": "its I2V experiments read pixels (VideoLoaderConfig) and encode frame 0 themselves; first_frame is the "
           "first frame's latents",
    "v2v-ic": "its V2V reads depth_latent.pth, no IC-LoRA reference; reference is the reference clip's latents, cut "
              "with the target's geometry",
    "a2v": _NO_AUDIO, "v2a": _NO_AUDIO, "t2a": _NO_AUDIO, "audio-inpaint": _NO_AUDIO, "a2a-ic": _NO_AUDIO,
    "av2av-ic": _NO_AUDIO,
    "video-inpaint": "it has no inpainting loader; mask is float32 0/1 on the latent grid [F', H', W']",
    "image-edit": "v0.2.0's ImageEditLoaderConfig is not public; source is the source image's latents",
    "camera-video": "v0.2.0's CameraVideoLoaderConfig is not public; camera is float32 [F, 20] per sample "
                    "(extrinsics row-major, fx fy cx cy)",
}
_RAW_GAPS = {"t2i": None,
             "image-edit": "v0.2.0's ImageEditLoaderConfig is not public; source is the edit's source image, resized "
                           "and cropped as the target"}


def fastgen_gap(mode: str, key_map: dict[str, str], fmt: str = LATENT_WDS) -> str | None:
    """Why FastGen v0.1.0 has no config that reads ``mode``'s samples with ``key_map`` (audio beside
    the video is one reason), or None."""
    gap = (_RAW_GAPS if fmt == WDS else FASTGEN_GAPS).get(mode)
    if gap is None and AUDIO in key_map:
        return _NO_AUDIO
    return gap


def preset_name(mode: str, fmt: str = LATENT_WDS) -> str | None:
    """The preset of ``mode``'s ``fmt`` datasets (``latent_v2v_ic``, ``image_edit``; ``image`` for a raw
    t2i set), or None where there is none."""
    if fmt == LATENT_WDS and mode in MODE_KEY_MAPS:
        return "latent_" + mode.replace("-", "_")
    if fmt == WDS and mode in RAW_MODE_KEY_MAPS:
        return "image" if mode == "t2i" else mode.replace("-", "_")
    return None


def mode_key_map(mode: str, fmt: str = LATENT_WDS, *, text: bool = True, audio: bool | None = None,
                 image_ext: str = JPG) -> dict[str, str]:
    """The key_map of ``mode``'s ``fmt`` samples: without ``condition`` when the build had no text
    encoder (``text=False``, latent_wds); ``audio``: whether every sample has audio latents beside its
    video latent (True adds ``audio: audio_latent.pth``, False drops the audio keys of a2v, v2a and
    av2av-ic, None keeps the table's; the audio-only modes' ``real`` stays); images of the raw wds
    output in ``image_ext``."""
    if fmt == WDS:
        if mode not in RAW_MODE_KEY_MAPS:
            raise KeyError(f"no raw wds preset for mode {mode!r}; modes with one: {', '.join(RAW_MODE_KEY_MAPS)}")
        return {k: (image_ext if v == JPG else source_member(image_ext) if v == source_member(JPG) else v)
                for k, v in RAW_MODE_KEY_MAPS[mode].items()}
    if mode not in MODE_KEY_MAPS:
        raise KeyError(f"unknown mode {mode!r}; one of {', '.join(MODE_KEY_MAPS)}")
    km = dict(MODE_KEY_MAPS[mode])
    if not text:
        km.pop(CONDITION, None)
    if audio and mode not in AUDIO_ONLY_MODES:
        km[AUDIO] = AUDIO_LATENT
    elif audio is False and mode not in AUDIO_ONLY_MODES:  # audio.skip: no audio latents at all
        km.pop(AUDIO, None)
        km.pop(REFERENCE_AUDIO, None)
    return km


def _base_defaults(mode: str, fmt: str) -> dict[str, Any]:
    """The preset's loader defaults as built with a text encoder (FastGen's preset of that kind)."""
    if fmt == WDS:
        return {"key_map": mode_key_map(mode, WDS), "presets_map": {"neg_condition": "empty_string"},
                "image_size": 512, "batch_size": 32}
    d: dict[str, Any] = {"key_map": mode_key_map(mode), "files_map": {"neg_condition": NEG_PROMPT_FILE}}
    return {**d, "batch_size": 32} if mode in IMAGE_MODES else {**d, "batch_size": 2, "num_workers": 2}


def _fastgen_name(mode: str, fmt: str) -> str:
    if fmt == WDS:
        return "ImageLoaderConfig"
    return "ImageLatentLoaderConfig" if mode in IMAGE_MODES else "VideoLatentLoaderConfig"


@dataclass(frozen=True)
class ModePreset:
    mode: str
    fmt: str
    fastgen: str
    defaults: dict[str, Any]
    note: str
    gap: str | None


def _note(mode: str, fmt: str) -> str:
    km = mode_key_map(mode, fmt)
    parts = [f"mode {mode}: " + ", ".join(f"{k} <- {v}" for k, v in km.items())]
    if fmt == LATENT_WDS:
        parts.append("condition only when the build had models.text; audio <- audio_latent.pth when it wrote "
                     "audio for every sample")
    return "; ".join(parts)


#: preset name -> its mode preset, one per mode and format
MODE_PRESETS: dict[str, ModePreset] = {}
for _fmt, _table, _gaps in ((LATENT_WDS, MODE_KEY_MAPS, FASTGEN_GAPS), (WDS, RAW_MODE_KEY_MAPS, _RAW_GAPS)):
    for _mode in _table:
        _name = preset_name(_mode, _fmt)
        if _name == "image":  # raw t2i is the image preset itself
            continue
        MODE_PRESETS[_name] = ModePreset(_mode, _fmt, _fastgen_name(_mode, _fmt), _base_defaults(_mode, _fmt),
                                         _note(_mode, _fmt), _gaps[_mode])


# ------------------------------------------------------------------ what the build wrote


@dataclass(frozen=True)
class ModeFacts:
    """What a dataset of a mode holds: its ``mode``, its output ``format``, whether the build had a
    text encoder (``text``) and wrote audio latents for every sample (``audio``), the raw images'
    format (``image_ext``); ``where``: where these were read (for messages)."""

    mode: str | None
    format: str
    text: bool
    audio: bool
    image_ext: str
    where: str


def _manifest_output(manifest: dict[str, Any], rel: str) -> str | None:
    """The name of the manifest's output whose files (any split) are the folder ``rel``."""
    outputs = manifest.get("outputs")
    for name, out in (outputs.items() if isinstance(outputs, dict) else ()):
        files = out.get("files") if isinstance(out, dict) else None
        for info in (files.values() if isinstance(files, dict) else ()):
            if isinstance(info, dict) and rel in (info.get("dir"), info.get("path")):
                return name
    return None


def build_facts(dataset: str | Path) -> ModeFacts | None:
    """The facts of ``dataset`` from the manifest of the shardsmith build that wrote it (its recorded
    recipe: ``mode``, the output's ``format`` and image format, ``models.text``, ``models.audio_vae``,
    ``audio``), or None when no build's manifest names it. A bucket's folder of a multi-bucket output
    is its output's."""
    dataset = Path(dataset).resolve()
    folder = dataset.parent if (dataset.parent / BUCKETS_INDEX_FILE).is_file() else dataset
    found = enclosing_build(folder.parent)
    if found is None or not found.has_manifest:
        return None
    mpath = found.root / MANIFEST_FILE
    try:
        manifest = read_json(mpath)
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("recipe") or {}, dict):
        return None  # not a manifest this reads (verify says what is wrong with it)
    name = _manifest_output(manifest, folder.relative_to(found.root).as_posix())
    recipe = manifest.get("recipe") or {}
    out = next((o for o in recipe.get("outputs") or [] if isinstance(o, dict) and o.get("name") == name), None)
    if name is None or out is None:
        return None
    models = recipe.get("models") or {}
    audio_rules = recipe.get("audio") or {}
    mode = recipe.get("mode")
    wrote_audio = out.get("format") == LATENT_WDS and models.get("audio_vae") is not None \
        and not audio_rules.get("skip")
    # every sample has its audio when items without audio fail (audio.required, the default with audio)
    audio = wrote_audio and (audio_rules.get("required") is not False or mode in AUDIO_VIDEO_MODES)
    ext = ((out.get("image") or {}).get("format")) or JPG
    return ModeFacts(mode, out.get("format", ""), models.get("text") is not None, audio, ext,
                     f"{mpath} output {name}")


def folder_facts(folder: str | Path, mode: str, fmt: str) -> ModeFacts:
    """The facts of a ``mode`` dataset no build's manifest names, from the folder itself: a text
    encoder where ``neg_prompt_emb.npy`` lies beside the shards (or beside a multi-bucket output's
    buckets), audio where every sample of the first shard has ``audio_latent.pth``, the raw images'
    format from the first sample."""
    from shardsmith.formats.wds import is_shard_file_name
    from shardsmith.formats.tar import tar_members

    folder = Path(folder)
    text = (folder / NEG_PROMPT_FILE).is_file() or (folder.parent / BUCKETS_INDEX_FILE).is_file() and (
        folder.parent / NEG_PROMPT_FILE).is_file()
    audio, ext = False, JPG
    shards = sorted(p for p in folder.iterdir() if p.is_file() and is_shard_file_name(p.name)) \
        if folder.is_dir() else []
    if shards:
        samples: dict[str, set[str]] = {}
        for name, _, _ in tar_members(shards[0])[:4096]:
            base = name.rsplit("/", 1)[-1]
            if "." in base:
                key, suffix = base.split(".", 1)
                samples.setdefault(key, set()).add(suffix)
        if samples:
            audio = all(AUDIO_LATENT in s for s in samples.values())
            first = next(iter(samples.values()))
            ext = next((s for s in sorted(first) if s in ("jpg", "png", "webp")), JPG)
    return ModeFacts(mode, fmt, text, audio, ext, f"{folder} (no build manifest names it: read from its files)")


def facts_for(dataset: str | Path, mode: str, fmt: str) -> ModeFacts:
    """The facts a ``mode`` preset's defaults follow: the build's manifest's when it wrote ``dataset``
    in that format, else the folder's."""
    facts = build_facts(dataset)
    if facts is not None and facts.format == fmt:
        return facts
    return folder_facts(dataset, mode, fmt)


def defaults_for(mp: ModePreset, dataset: str | Path) -> dict[str, Any]:
    """The loader defaults of mode preset ``mp`` for ``dataset``: its key_map as the build wrote it
    (no ``condition`` and no ``neg_condition`` constant without a text encoder; ``audio`` with audio)."""
    facts = facts_for(dataset, mp.mode, mp.fmt)
    d = {**mp.defaults}
    if mp.fmt == WDS:
        d["key_map"] = mode_key_map(mp.mode, WDS, image_ext=facts.image_ext)
        return d
    d["key_map"] = mode_key_map(mp.mode, LATENT_WDS, text=facts.text, audio=facts.audio)
    if not facts.text:
        d["files_map"] = {}
    return d


#: the output format ``shardsmith distill`` writes; read by ``kd_path`` (with ``path.pth``) or ``kd_pair``
KD_WDS = "kd_wds"


def kd_preset_for(dataset: str | Path) -> tuple[str, str] | None:
    """``(preset, where it was read)`` of a knowledge-distillation dataset, or None for another: one
    the manifest of the build that wrote it calls ``format: kd_wds``, or, where no manifest names it,
    whose ``index.json`` says ``format: shardsmith-kd``. ``kd_pair`` where index.json says
    ``has_path: false``, else ``kd_path``."""
    from shardsmith.formats.kd import KD_FORMAT, read_kd_index

    facts = build_facts(dataset)
    try:
        index = read_kd_index(dataset)
    except (OSError, ValueError):
        index = None
    if facts is not None:
        if facts.format != KD_WDS:
            return None
        where = f"output format {KD_WDS} of the build ({facts.where})"
    elif isinstance(index, dict) and index.get("format") == KD_FORMAT:
        where = f"{Path(dataset) / 'index.json'} says format {KD_FORMAT} (no build manifest names the folder)"
    else:
        return None
    has_path = not isinstance(index, dict) or index.get("has_path", True) is not False
    return ("kd_path" if has_path else "kd_pair"), where


def mode_preset_for(dataset: str | Path) -> tuple[str, ModeFacts] | None:
    """``(preset, facts)`` of the mode preset for ``dataset`` when the build that wrote it (its
    manifest) has a ``mode`` and a preset exists for that mode in its format; else None."""
    facts = build_facts(dataset)
    if facts is None or not facts.mode:
        return None
    name = preset_name(facts.mode, facts.format)
    return (name, facts) if name is not None else None
