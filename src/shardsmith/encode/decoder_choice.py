"""Which JPEG decoder a build uses: ``images.decoder`` (``auto``, ``cpu``, ``cpu-draft``, ``gpu``) settled once.

Contract
- :func:`settle(recipe, ledger, workers)`: the build's ``images.decoder`` (``cpu``, ``cpu-draft`` or
  ``gpu``; ``auto`` resolved by :func:`resolve_decoder`), decided once and kept in the ledger, so a
  resumed build decodes as it began. Recipes without a VAE and a latent output are returned as they are.
- :func:`settled(setting)`: the setting as a maker outside a build reads it (``auto`` -> ``cpu``).
- :func:`check_gpu(recipe)`: the precheck of ``images.decoder: gpu``.
- This module imports no torch, and a build's ``auto`` asks NVML whether there is a GPU
  (:mod:`shardsmith.encode.nvml_count`): a build settles it without paying torch's import before its plan
  (torch is imported beside the plan, by the model loader). torchvision's decoder
  (:mod:`shardsmith.encode.gpu_decode`) is imported only where the answer depends on it.
"""

from __future__ import annotations

NAME = "nvjpeg"  # what the manifest and the cache stamp call the GPU decoder
MIN_CPU_WORKERS = 4  # auto: fewer decode workers than this on a GPU machine -> decode JPEGs on the GPU
LEDGER_KEY = "image_decoder"
MANIFEST_NAMES = {"gpu": NAME, "cpu-draft": "pil-draft"}  # "cpu" (Pillow, full decode) is not named


def settled(setting: str) -> str:
    """``images.decoder`` as a maker reads it: a build settles ``auto`` first (:func:`settle`); any
    other caller (scan, verify's re-decode) takes the exact CPU path."""
    return "cpu" if setting == "auto" else setting


def resolve_decoder(setting: str, device: str, workers: int = 8) -> str:
    """``images.decoder`` for encoders on ``device`` (resolved: ``cpu``, ``cuda``, ``cuda:N``) with
    ``workers`` decode workers. ``auto``: off a GPU ``cpu``; on one ``cpu-draft`` (the decode workers
    keep ahead of the encoder), or ``gpu`` where fewer than :data:`MIN_CPU_WORKERS` workers would not
    and nvJPEG imports. ``gpu`` without a CUDA device or nvJPEG is a ``DeviceError`` naming the fix."""
    from shardsmith.precheck import DeviceError

    if setting in ("cpu", "cpu-draft"):
        return setting
    on_gpu = device.startswith("cuda")

    def problem() -> str | None:  # (imports torch and torchvision: seconds, so only where the answer matters)
        from shardsmith.encode import gpu_decode

        return None if gpu_decode.DECODE is not gpu_decode._torchvision_decode else gpu_decode.gpu_decoder_problem()

    if setting == "auto":
        if not on_gpu:
            return "cpu"
        return "gpu" if workers < MIN_CPU_WORKERS and problem() is None else "cpu-draft"
    if not on_gpu:
        raise DeviceError(f"images.decoder is gpu, but the encoders run on {device}; set images.decoder: auto "
                          "(the GPU when the encoders use one) or cpu")
    why = problem()
    if why is not None:
        raise DeviceError(f"images.decoder is gpu, but {why}; install the torchvision build that matches "
                          "your torch (pip install torchvision), or set images.decoder: cpu")
    return "gpu"


def check_gpu(recipe) -> None:
    """Precheck: ``images.decoder: gpu`` only where the encoders run on CUDA and nvJPEG imports."""
    from shardsmith.precheck import resolve_device

    if recipe.images.decoder == "gpu":
        resolve_decoder("gpu", resolve_device(recipe.models.device, "models.device"))


def settle(recipe, ledger, workers: int):
    """The recipe a build runs, with ``images.decoder`` settled once and kept in the ledger: a resumed
    build decodes as it began, whatever this machine would choose now (a ledger with results and no
    record is a build from before the setting: ``cpu``). Recipes without a latent output are returned
    as they are."""
    from shardsmith.precheck import DeviceError, resolve_device
    from shardsmith.recipe import LATENT_OUTPUTS

    if recipe.models.vae is None or not any(isinstance(o, LATENT_OUTPUTS) for o in recipe.outputs):
        return recipe
    if ledger.get_meta(LEDGER_KEY) == "gpu":  # a resumed build must decode as it began
        try:
            resolve_decoder("gpu", resolve_device(recipe.models.device, "models.device"))
        except DeviceError as exc:
            raise DeviceError(f"this build began decoding JPEGs on the GPU (images.decoder settled to gpu) and "
                              f"must resume the same way, but {str(exc).split('but ', 1)[-1]}") from None
    chosen = ledger.kept_choice(LEDGER_KEY, "cpu", lambda: resolve_decoder(  # (NVML first: torch's import is
        recipe.images.decoder, resolve_device(recipe.models.device, "models.device", quick=True), workers))  # seconds)
    return recipe.settled("images", "decoder", chosen)
