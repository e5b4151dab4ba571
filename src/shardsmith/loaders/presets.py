"""Named loader presets, matching FastGen's ``configs/data.py`` (v0.1.0) defaults.

``preset_config(name, path)`` returns a typed config (:class:`WdsLoaderConfig` or
:class:`ZipLoaderConfig`) that callers copy and change (``model_copy(update=...)``), never
re-type. ``build_loader(config)`` turns either config into an iterable loader.
``from_config(name)`` builds the loader of a dataset registered with ``shardsmith register``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardsmith.formats.wds import BUCKETS_INDEX_FILE, JPG, LATENT, MP4, NEG_PROMPT_FILE, NOISE, PATH, TEXT_EMB, TXT
from shardsmith.loaders import registry
# the recipe modes' key_maps, in one table: mode_presets.MODE_KEY_MAPS (latent_wds), RAW_MODE_KEY_MAPS (wds)
from shardsmith.loaders.mode_presets import MODE_PRESETS
from shardsmith.loaders.wds import WdsLoader
from shardsmith.loaders.wds_config import WdsLoaderConfig, files_ref
from shardsmith.loaders.zip import ZipLoaderConfig


@dataclass(frozen=True)
class Preset:
    kind: str  # "wds" | "zip"
    fastgen: str  # the FastGen preset it mirrors
    defaults: dict[str, Any] = field(default_factory=dict)
    note: str = ""
    # (file, defaults): when the dataset folder holds ``file``, these defaults replace the keys they name
    variant: tuple[str, dict[str, Any]] | None = None
    # a mode preset (loaders/mode_presets.py): the recipe mode whose datasets it reads; its key_map
    # follows what the build wrote (text encoder, audio), read from the build's manifest
    mode: str | None = None
    # what FastGen v0.1.0 lacks to train this mode (register prints it as a comment); None: nothing
    gap: str | None = None
    name: str = ""  # a mode preset's own name (its key in PRESETS)

    def defaults_for(self, path: str | Path) -> dict[str, Any]:
        """The defaults for the dataset at ``path`` (the variant's, where its file lies there; a mode
        preset's key_map as the build that wrote ``path`` made its samples)."""
        if self.mode is not None:
            from shardsmith.loaders import mode_presets

            return mode_presets.defaults_for(mode_presets.MODE_PRESETS[self.name], path)
        if self.variant is not None and (Path(path) / self.variant[0]).is_file():
            return {**self.defaults, **self.variant[1]}
        return self.defaults


_LATENT = {"key_map": {"real": LATENT, "condition": TEXT_EMB},
           "files_map": {"neg_condition": NEG_PROMPT_FILE}}

PRESETS: dict[str, Preset] = {
    "image": Preset("wds", "ImageLoaderConfig",
                    {"key_map": {"real": JPG, "condition": TXT}, "presets_map": {"neg_condition": "empty_string"},
                     "image_size": 512, "batch_size": 32}),
    "image_latent": Preset("wds", "ImageLatentLoaderConfig", {**_LATENT, "batch_size": 32},
                           "neg_condition comes from neg_prompt_emb.npy beside the shards"),
    "video": Preset("wds", "VideoLoaderConfig",
                    {"key_map": {"real": MP4, "condition": TXT}, "presets_map": {"neg_condition": "neg_prompt_wan"},
                     "num_frames": 81, "video_size": (480, 832), "batch_size": 2, "num_workers": 2},
                    "real is float32 [B, 3, 81, 480, 832] in [-1, 1] (FastGen sequence_length=81, "
                    "img_size=(832, 480) as (W, H); our video_size is (H, W)); clips under 81 frames are dropped"),
    "video_latent": Preset("wds", "VideoLatentLoaderConfig", {**_LATENT, "batch_size": 2, "num_workers": 2}),
    "kd_pair": Preset("wds", "PairLoaderConfig",
                      {"key_map": {"real": LATENT, "noise": NOISE, "condition": TEXT_EMB},
                       "batch_size": 2, "shuffle_size": 100}),
    "kd_path": Preset("wds", "PathLoaderConfig",
                      {"key_map": {"real": LATENT, "path": PATH, "condition": TEXT_EMB},
                       "batch_size": 2, "shuffle_size": 100}),
    # prompt_wds: the prompts (the trainer encodes them); with the embeddings the build wrote when
    # models.text was set (it writes neg_prompt_emb.npy exactly then), those and the negative one
    "prompt": Preset("wds", "PromptLoaderConfig",
                     {"key_map": {"condition": TXT}, "presets_map": {"neg_condition": "empty_string"},
                      "batch_size": 32},
                     "condition is list[str]; where neg_prompt_emb.npy lies beside the shards, condition is the "
                     "txt_emb.pth embeddings [B, L, D] and neg_condition that file (PromptLoaderConfig's fields are "
                     "not in the FastGen reference: mirrored from ImageLoaderConfig / ImageLatentLoaderConfig)",
                     variant=(NEG_PROMPT_FILE, {"key_map": {"condition": TEXT_EMB}, "presets_map": {},
                                                "files_map": {"neg_condition": NEG_PROMPT_FILE}})),
    "class_zip": Preset("zip", "ImageNet64_Loader_Config", {"batch_size": 32, "use_labels": True, "shuffle": True}),
}
# one preset per recipe mode (latent_v2v_ic, latent_i2v, image_edit, ...): MODE_KEY_MAPS in one place
PRESETS.update({name: Preset("wds", mp.fastgen, mp.defaults, mp.note, mode=mp.mode, gap=mp.gap, name=name)
                for name, mp in MODE_PRESETS.items()})


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    return PRESETS[name]


def _bucketed(path: str | Path) -> bool:
    """Whether ``path`` is a multi-bucket output (one shard folder per bucket inside it)."""
    from shardsmith.formats.detect import dataset_kind

    try:
        return dataset_kind(Path(path)) == "wds_buckets"
    except (ValueError, OSError):
        return False


def preset_config(name: str, path: str | Path, **overrides: Any) -> WdsLoaderConfig | ZipLoaderConfig:
    """A fresh typed config of preset ``name`` for the dataset at ``path``."""
    p = get_preset(name)
    kw = {**copy.deepcopy(p.defaults_for(path)), **overrides}
    if p.kind == "zip":
        return ZipLoaderConfig(path=Path(path), **kw)
    in_buckets = (Path(path).parent / BUCKETS_INDEX_FILE).is_file()  # one bucket's folder of a multi-bucket output
    if "files_map" not in overrides and not _bucketed(path) and not in_buckets:
        # a preset's files_map names files inside the shard folder (the build writes
        # neg_prompt_emb.npy there); written as the relative path FastGen's rule resolves to that
        # file (``train/neg_prompt_emb.npy`` for ``.../train``), so FastGen and this loader open the
        # same file. A multi-bucket folder keeps the bare name: each bucket's datatag's dirname is it
        # (so one bucket's folder, verified on its own, keeps it too: the file beside the buckets).
        kw["files_map"] = {k: files_ref(path, v) for k, v in kw.get("files_map", {}).items()}
    return WdsLoaderConfig(shards=path if isinstance(path, str) else Path(path), **kw)


def build_loader(config: WdsLoaderConfig | ZipLoaderConfig):
    """The loader of ``config``; a multi-bucket output (``buckets.json``) gets the bucket-aware
    loader (:mod:`shardsmith.loaders.buckets`)."""
    if isinstance(config, ZipLoaderConfig):
        return config.build()
    from shardsmith.loaders.buckets import BucketedWdsLoader, is_bucketed

    return BucketedWdsLoader(config) if is_bucketed(config.shards) else WdsLoader(config)


def from_config(name: str, config_file: str | Path | None = None, **overrides: Any):
    """Build the loader of dataset ``name`` from the data-config file (see ``register``)."""
    entry = registry.get_entry(name, registry.config_path(config_file))
    path = registry.resolve(entry["path"])
    if entry.get("kind") == "precomputed":  # registered .precomputed/ tree: the LTX-style dataset
        from shardsmith.loaders.precomputed import PrecomputedDataset

        return PrecomputedDataset(path, entry["dirs"])
    return build_loader(preset_config(entry["preset"], path, **{**entry.get("overrides", {}), **overrides}))


# -- what a preset needs of a dataset's samples (register refuses a preset that would load no sample) ---------

def _sample_folder(path: Path) -> Path:
    """The folder whose shards stand for the dataset at ``path``: a multi-bucket output's first bucket with
    samples, else ``path`` itself."""
    from shardsmith.formats.wds import read_buckets_index

    index = read_buckets_index(path) if (path / BUCKETS_INDEX_FILE).is_file() else None
    if index:
        full = sorted(b for b, e in index.items() if isinstance(e, dict) and e.get("samples", 0) > 0 and e.get("dir"))
        if full:
            return path / index[full[0]]["dir"]
    return path


def sample_members(path: str | Path) -> set[str] | None:
    """The member suffixes (``jpg``, ``latent.pth`` ...) the samples of the first shard of the WebDataset at
    ``path`` hold (any of them), or None when that cannot be told (no shard, an unreadable one: the
    dataset's own checks say that)."""
    from shardsmith.formats.wds import is_shard_file_name
    from shardsmith.loaders.shard_reader import shard_samples

    folder = _sample_folder(Path(path))
    try:
        shards = sorted(p for p in folder.iterdir() if is_shard_file_name(p.name) and p.is_file())
        if not shards:
            return None
        samples = shard_samples(shards[0], remember=False)
    except (OSError, ValueError):
        return None
    held = {suffix for _, members in samples for suffix in members}
    return held or None


def preset_lacks(name: str, path: str | Path, members: set[str] | None = None, **overrides: Any) -> dict[str, str]:
    """What the samples of the WebDataset at ``path`` lack for preset ``name`` (with ``overrides``), as
    ``{batch key: what}``: each ``key_map`` member no ``files_map`` / ``presets_map`` constant stands in for
    that no sample of the first shard holds (the loader would drop every sample, ``missing:<suffix>``), and
    each ``files_map`` file that is not there (the loader would fail at start); {} when it fits (or the
    members cannot be read)."""
    members = sample_members(path) if members is None else members
    if members is None:
        return {}
    cfg = preset_config(name, path, **overrides)
    if not isinstance(cfg, WdsLoaderConfig):
        return {}
    constants = set(cfg.files_map) | set(cfg.presets_map)
    lacks = {key: f"{suffix} ({key})" for key, suffix in cfg.key_map.items()
             if key not in constants and suffix not in members}
    bucketed = _bucketed(path)
    for key, rel in cfg.files_map.items():
        where = Path(rel) if Path(rel).is_absolute() else (Path(path) / rel if bucketed else cfg.constant_path(rel))
        if not where.is_file():
            lacks[key] = f"{Path(rel).name} beside the shards ({key})"
    return lacks


def held_overrides(name: str, path: str | Path, **overrides: Any) -> dict[str, Any] | None:
    """The ``--set`` overrides that let preset ``name`` read the samples of ``path`` as they are, when they
    hold its ``real`` member and lack only others: its ``key_map`` less the members they lack (images without
    captions: ``{real: jpg}``), and its ``files_map`` less the files that are not there (latents built
    without a text encoder: ``{}``); None when they fit already or lack ``real``."""
    lacks = preset_lacks(name, path, **overrides)
    cfg = preset_config(name, path, **overrides)
    if not lacks or not isinstance(cfg, WdsLoaderConfig) or "real" in lacks or "real" not in cfg.key_map:
        return None
    held: dict[str, Any] = {"key_map": {k: v for k, v in cfg.key_map.items() if k not in lacks}}
    if set(lacks) & set(cfg.files_map):
        held["files_map"] = {k: v for k, v in cfg.files_map.items() if k not in lacks}
    return held


#: the presets suggested by what a dataset's samples hold (a mode preset is picked from the build's manifest)
_GENERIC = ("kd_path", "kd_pair", "image_latent", "video_latent", "image", "video", "prompt")


def fitting_presets(path: str | Path, first: str | None = None) -> list[str]:
    """The presets whose members the samples of the WebDataset at ``path`` hold (:func:`preset_lacks`), the
    one that reads the most of them first (``first``, e.g. the preset ``verify`` picks, leads when it fits)."""
    members = sample_members(path)
    if members is None:
        return []
    names = list(dict.fromkeys(([first] if first else []) + list(_GENERIC)))
    fit = []
    for name in names:
        try:
            if not preset_lacks(name, path, members):
                fit.append(name)
        except (ValueError, KeyError):
            continue
    used = {n: len(get_preset(n).defaults_for(path).get("key_map", {})) for n in fit}
    return sorted(fit, key=lambda n: (n != first, -used[n]))
