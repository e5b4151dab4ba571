"""What identifies an encoder's model in a manifest or a cache stamp.

Contract
- :func:`clean_config` drops diffusers' bookkeeping keys (those starting with ``_``) from a config.
- :func:`model_identity` turns one model's manifest block (``{"spec": ..., "provenance": ...}``)
  into a short, stable dict: same weights, config and dtype give the same dict; devices and
  batch sizes are not part of it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def clean_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """A model config without diffusers' bookkeeping keys (``_use_default_values`` is an unordered set)."""
    return {k: v for k, v in cfg.items() if not k.startswith("_")}


def model_identity(model: dict[str, Any]) -> dict[str, Any]:
    """A short, stable identity of one model: enough to tell two caches apart, small enough to print."""
    spec, prov = model["spec"], model["provenance"]
    cfg = json.dumps(clean_config(prov.get("config") or {}), sort_keys=True, default=str)
    quantized = {"quantize": spec["quantize"]} if spec.get("quantize") else {}  # (older stamps stay equal)
    return {**quantized, "class": prov.get("cls"), "family": spec.get("family"), "weights": prov.get("weights"),
            "path_or_repo": prov.get("path_or_repo"), "subfolder": prov.get("subfolder"),
            "revision": prov.get("revision"), "weights_sha256": prov.get("weights_sha256"),
            "config": prov.get("config_name"), "config_sha256": hashlib.sha256(cfg.encode()).hexdigest()[:16],
            "store": spec.get("store"), "dtype": spec.get("dtype"), "max_length": spec.get("max_length")}
