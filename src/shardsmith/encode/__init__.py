"""Encode stage: image / video VAEs (diffusers) and text encoders (transformers), each with
an :class:`EncoderSpec` (what it produces) and a :class:`Provenance` (where its weights
came from; random weights are always labelled ``"random-weights"``).

The names below are imported on first use: importing a torch-free submodule such as
:mod:`shardsmith.encode.vae_config` (the recipe precheck does) does not import torch.
"""

from importlib import import_module
from typing import Any

_WHERE = {
    "ENCODERS": "registry", "families": "registry", "load_encoder": "registry",
    "EncoderSpec": "spec", "Provenance": "spec", "check_pixel_shape": "spec", "sha256_files": "spec",
    "TextEmbeddings": "text", "TextEncoder": "text", "load_text_encoder": "text",
    "VaeEncoder": "vae", "denormalise": "vae", "load_vae": "vae", "normalise": "vae", "vae_geometry": "vae",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    """``shardsmith.encode.<name>`` for the names of ``__all__``, imported from their module on first use."""
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value
