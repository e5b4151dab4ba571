"""FastGen config snippets: the preset override a user pastes into a FastGen experiment.

Field names follow FastGen v0.1.0 (``configs/data.py``, ``BaseWDSLoader``): ``datatags``
(``"WDS:<dir>"``), ``batch_size``, ``deterministic`` + ``shard_count_file`` +
``sampler_start_idx=None`` for exact resume, ``ignore_index_paths``, ``files_map``. See
shared/reference/fastgen.md §2 and §4.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardsmith.formats.wds import IGNORE_INDEX_FILE, SHARD_COUNT_FILE
from shardsmith.loaders.decoders import size_hw


def _expr(portable: str, root_env: str, tail: str = "") -> str:
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
    var = f"{name.upper().replace('-', '_')}_Loader_Config"
    lines = ["import os", f"from fastgen.configs.data import {preset.fastgen}", "",
             f"{var} = {preset.fastgen}.copy()"]
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
        if defaults is not preset.defaults:  # a variant for what this folder holds (the prompt preset's embeddings)
            lines.append(f"{var}.key_map = {defaults['key_map']!r}")
            lines.append(f"{var}.presets_map = {defaults.get('presets_map', {})!r}")
        for key, rel in defaults.get("files_map", {}).items():
            lines.append(f'{var}.files_map = {{"{key}": {_expr(portable, root_env, rel)}}}')
    for k, v in fastgen_fields(overrides).items():
        lines.append(f"{var}.{k} = {v!r}")
    lines.append(f"# in the experiment: config.dataloader_train = {var}")
    return "\n".join(lines)
