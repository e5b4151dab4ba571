"""FastGen config snippets: the preset override a user pastes into a FastGen experiment.

Field names follow FastGen v0.1.0 (``configs/data.py``, ``BaseWDSLoader``): ``datatags``
(``"WDS:<dir>"``), ``batch_size``, ``deterministic`` + ``shard_count_file`` +
``sampler_start_idx=None`` for exact resume, ``ignore_index_paths``, ``files_map``. See
shared/reference/fastgen.md §2 and §4.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardsmith.formats.wds import IGNORE_INDEX_FILE, NEG_PROMPT_FILE, SHARD_COUNT_FILE, read_buckets_index
from shardsmith.loaders.decoders import size_hw
from shardsmith.loaders.registry import config_var


def _expr(portable: str, root_env: str, tail: str = "") -> str:
    """Python for the path ``portable`` (``${ROOT_ENV}/rel``, or an absolute path where the variable was not
    set at register time) joined with ``tail``."""
    if not portable.startswith(f"${{{root_env}}}"):
        return repr(f"{portable.rstrip('/')}/{tail}" if tail else portable)
    rel = portable.removeprefix(f"${{{root_env}}}").lstrip("/")
    parts = ", ".join(repr(x) for x in ([rel] if rel else []) + ([tail] if tail else []))
    return f'os.path.join(os.environ["{root_env}"]{", " + parts if parts else ""})'


def fastgen_fields(overrides: dict[str, Any]) -> dict[str, Any]:
    """Our loader fields under FastGen's names (reference/fastgen.md §2): ``num_frames`` ->
    ``sequence_length``; ``video_size`` (H, W) -> ``img_size`` (W, H); ``image_size`` ->
    ``input_res`` (an int; a (H, W) pair stays (h, w), torchvision's order). Other keys pass."""
    out: dict[str, Any] = {}
    for k, v in overrides.items():
        if k == "num_frames":
            out["sequence_length"] = v
        elif k == "video_size":
            h, w = size_hw(v)
            out["img_size"] = (w, h)
        elif k == "image_size":
            out["input_res"] = v if isinstance(v, int) else tuple(v)
        else:
            out[k] = v
    return out


def fastgen_snippet(name: str, preset, portable: str, dataset: Path, root_env: str,
                    overrides: dict[str, Any]) -> str:
    """The override to paste; for a multi-bucket output (``buckets.json``), one config per bucket:
    FastGen has no multi-bucket loader, and one datatag over several shapes cannot be batched."""
    index = read_buckets_index(dataset)
    if index is None:
        return _snippet(name, preset, portable, dataset, root_env, overrides)
    buckets = [b for b in sorted(index) if index[b].get("samples")]
    head = [f"# {dataset} holds {len(buckets)} buckets ({', '.join(buckets)}): FastGen v0.1.0 has no multi-bucket",
            "# loader, so each bucket is a config of its own (every batch then has one shape). Train on one,",
            "# or on each in turn; shardsmith's own loader (from_config) interleaves them by a seeded schedule."]
    parts = []
    for b in buckets:
        sub = dataset / index[b]["dir"]
        text = _snippet(f"{name}_{b}", preset, f"{portable.rstrip('/')}/{index[b]['dir']}", sub, root_env, overrides,
                        files_root=(portable, dataset))
        parts.append(text if not parts else "\n".join(text.splitlines()[3:]))  # the imports once
    return "\n".join(head + ["\n".join(parts)])


def mode_comments(preset, dataset: Path) -> list[str]:
    """The comment lines above a recipe mode's config: which mode and key_map it is, what FastGen
    v0.1.0 lacks to train it (``preset.gap``), and a missing text condition."""
    from shardsmith.loaders.mode_presets import MODE_PRESETS, fastgen_gap

    km = preset.defaults_for(dataset)["key_map"]
    out = [f"# mode {preset.mode} (shardsmith preset {preset.name}): key_map " + ", ".join(f"{k} <- {v}"
                                                                                        for k, v in km.items())]
    gap = fastgen_gap(preset.mode, km, MODE_PRESETS[preset.name].fmt)
    if gap:
        out += [f"# FastGen v0.1.0 has no config for mode {preset.mode}: {gap}.",
                f"# This is {preset.fastgen} with the mode's key_map, for a trainer that reads those batch keys."]
    if "condition" not in km:
        out.append("# no txt_emb.pth in these samples (the build had no models.text): FastGen's trainer needs a "
                   "condition; build with models.text to get one")
    return out


def _snippet(name: str, preset, portable: str, dataset: Path, root_env: str, overrides: dict[str, Any],
             files_root: tuple[str, Path] | None = None) -> str:
    """One FastGen config; ``files_root``: (portable, folder) where ``files_map`` files lie, when
    not the dataset's own folder (a multi-bucket output keeps one constant beside its buckets)."""
    var = config_var(name)
    lines = ["import os", f"from fastgen.configs.data import {preset.fastgen}", ""]
    if preset.mode is not None:  # a recipe mode's preset: its key_map, and what FastGen v0.1.0 lacks for it
        lines += mode_comments(preset, dataset)
    lines.append(f"{var} = {preset.fastgen}.copy()")
    if preset.kind == "zip":
        lines.append(f"{var}.dataset.path = {_expr(portable, root_env)}")
    else:
        lines.append(f'{var}.datatags = ["WDS:" + {_expr(portable, root_env)}]')
        if (dataset / SHARD_COUNT_FILE).exists():
            lines += [f"{var}.deterministic = True  # exact resume from the trainer's image count",
                      f"{var}.sampler_start_idx = None",
                      f"{var}.shard_count_file = {_expr(portable, root_env, SHARD_COUNT_FILE)}"]
        if (dataset / IGNORE_INDEX_FILE).exists():
            lines.append(f"{var}.ignore_index_paths = [{_expr(portable, root_env, IGNORE_INDEX_FILE)}]")
        defaults = preset.defaults_for(dataset)
        if preset.mode is not None:  # the mode's key_map, as the build wrote its samples
            lines.append(f"{var}.key_map = {defaults['key_map']!r}")
            if not defaults.get("files_map") and preset.defaults.get("files_map"):
                lines.append(f"{var}.files_map = {{}}  # no {NEG_PROMPT_FILE}: the build had no models.text")
        elif defaults is not preset.defaults:  # a variant for what this folder holds (the prompt preset's embeddings)
            lines.append(f"{var}.key_map = {defaults['key_map']!r}")
            lines.append(f"{var}.presets_map = {defaults.get('presets_map', {})!r}")
        for key, rel in defaults.get("files_map", {}).items():
            where = portable if files_root is None else files_root[0]
            lines.append(f'{var}.files_map = {{"{key}": {_expr(where, root_env, rel)}}}')
    for k, v in fastgen_fields(overrides).items():
        lines.append(f"{var}.{k} = {v!r}")
    lines.append(f"# in the experiment: config.dataloader_train = {var}")
    return "\n".join(lines)
