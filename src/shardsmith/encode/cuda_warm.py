"""The GPU's libraries loaded while the models' Python imports run.

A build's model load is a chain: ``import diffusers`` (and the transformers, scipy ... it pulls in: Python,
under the interpreter lock), the model, then its first batch, which loads cuDNN, cuBLAS and cuFFT (hundreds of
megabytes of shared libraries) and makes their handles. Those loads run inside torch ops, which let the lock go.
:func:`start` runs one tiny op of each library the recipe's encoders call on a thread of its own, so they load
beside the imports instead of after them.

Contract:
- ``ops(recipe)``: the ``(op, dtype)`` pairs the recipe's encoders start with (pure): a convolution per VAE
  (``conv3d`` for a video VAE), a matmul per text encoder or teacher, and for an audio encoder its mel's STFT, a
  matmul and a convolution, each in the model's dtype.
- ``start(recipe, device)``: on a CUDA device, a daemon thread running :func:`ops` on zeros there, returned (join it
  before the first real batch); ``None`` on any other device, or without models. It draws no random numbers (a
  random-weight model seeds the device's generator on the loading thread), sets no global flag, and a failure is
  left to the real batches, which report it (logged here at debug level only).
"""

from __future__ import annotations

import logging
import threading

from shardsmith.encode.vae_config import FAMILIES

log = logging.getLogger(__name__)


def ops(recipe) -> list[tuple[str, str]]:
    """``(op, dtype)`` of each library call the recipe's encoders start with, without repeats, in a fixed order."""
    m = recipe.models
    out: list[tuple[str, str]] = []
    if m.vae is not None:
        out.append(("conv3d" if FAMILIES[m.vae.family]["kind"] == "video_vae" else "conv2d", m.vae.dtype))
    for model in (m.text, m.teacher):
        if model is not None:
            out.append(("matmul", model.dtype))
    if m.audio_vae is not None:
        out += [("stft", "float32"), ("matmul", "float32"), ("conv2d", m.audio_vae.dtype)]
    return list(dict.fromkeys(out))


def _run(device: str, todo: list[tuple[str, str]]) -> None:
    """The ops of ``todo`` on zeros on ``device`` (any device: the tests run them on the CPU)."""
    import torch
    import torch.nn.functional as F

    try:
        dev = torch.device(device)
        for op, name in todo:
            dtype = getattr(torch, name)
            if op == "matmul":
                a = torch.zeros((64, 64), device=dev, dtype=dtype)
                a @ a
            elif op == "stft":
                x = torch.zeros((2, 4096), device=dev)
                torch.stft(x, 1024, hop_length=256, window=torch.ones(1024, device=dev), return_complex=True)
            else:  # conv2d / conv3d: cuDNN's libraries and a handle
                k = 3 if op == "conv3d" else 2
                x = torch.zeros((1, 8, *(8,) * k), device=dev, dtype=dtype)
                w = torch.zeros((8, 8, *(3,) * k), device=dev, dtype=dtype)
                (F.conv3d if k == 3 else F.conv2d)(x, w, padding=1)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    except Exception as exc:  # noqa: BLE001 - an optimisation only: the real batches meet and report any fault
        log.debug("GPU library warm-up stopped: %s", exc)


def start(recipe, device: str) -> threading.Thread | None:
    """See the module contract. ``device``: the resolved ``models.device`` (``cuda``, ``cuda:N``, ``cpu`` ...)."""
    todo = ops(recipe)
    if not device.startswith("cuda") or not todo:
        return None
    t = threading.Thread(target=_run, args=(device, todo), name="shardsmith-cuda-warm", daemon=True)
    t.start()
    return t
