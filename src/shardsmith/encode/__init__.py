"""Encode stage: image / video VAEs (diffusers) and text encoders (transformers), each with
an :class:`EncoderSpec` (what it produces) and a :class:`Provenance` (where its weights
came from; random weights are always labelled ``"random-weights"``)."""

from .registry import ENCODERS, families, load_encoder
from .spec import EncoderSpec, Provenance, check_pixel_shape, sha256_files
from .text import TextEmbeddings, TextEncoder, load_text_encoder
from .vae import VaeEncoder, denormalise, load_vae, normalise, vae_geometry

__all__ = [
    "ENCODERS", "EncoderSpec", "Provenance", "TextEmbeddings", "TextEncoder", "VaeEncoder",
    "check_pixel_shape", "denormalise", "families", "load_encoder", "load_text_encoder", "load_vae",
    "normalise", "sha256_files", "vae_geometry",
]
