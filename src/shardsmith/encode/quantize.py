"""Text encoders in 8 bits (``models.text.quantize``; LTX's ``--load-text-encoder-in-8bit``), through torchao.

Contract
- ``quantize_text(encoder, mode)``: ``none`` leaves the encoder as it is; ``int8`` replaces every linear
  layer's weights by int8 with a per-channel scale (torchao ``Int8WeightOnlyConfig``: weights in a quarter of
  float32's memory, activations in the encoder's dtype; CPU and GPU); ``fp8`` by float8 e4m3 weights
  (``Float8WeightOnlyConfig``; a GPU with fp8, Ada or Hopper). The encoder's ``spec.quantize`` says which,
  so the manifest and every cache stamp tell its embeddings from a full-precision encoder's.
- ``check_quantize(mode, device)``: the precheck: torchao importable (else a
  :class:`~shardsmith.precheck.MissingPackageError` with the install line), ``fp8`` only on a CUDA device
  of compute capability 8.9 or above.
"""

from __future__ import annotations

import logging
import warnings

QUANT = ("torchao", "torchao==0.18.0")  # (module, pip line): the shardsmith[quant] extra


def check_quantize(mode: str, device: str) -> None:
    from shardsmith.errors import UserError
    from shardsmith.precheck import import_optional

    if mode == "none":
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.getLogger("torchao").setLevel(logging.ERROR)
        import_optional(*QUANT, f"models.text.quantize: {mode} (--load-text-encoder-in-8bit)")
    if mode == "fp8":
        import torch

        ok = device.startswith("cuda") and torch.cuda.is_available() and torch.cuda.get_device_capability(
            int(device.split(":")[1]) if ":" in device else None) >= (8, 9)
        if not ok:
            raise UserError(f"models.text.quantize: fp8 needs a GPU with float8 (compute capability 8.9+: Ada, "
                            f"Hopper); the text encoder runs on {device} here: use int8")


def quantize_text(encoder, mode: str):
    """Quantize ``encoder.model``'s linear layers in place (see the module contract); the encoder."""
    if mode == "none":
        return encoder
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torchao.quantization import Float8WeightOnlyConfig, Int8WeightOnlyConfig, quantize_

        quantize_(encoder.model, Int8WeightOnlyConfig() if mode == "int8" else Float8WeightOnlyConfig())
    encoder.spec.quantize = mode
    return encoder
