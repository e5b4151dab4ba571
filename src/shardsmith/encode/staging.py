"""The host side of a batch: decoded uint8 frames stacked into one tensor, and that tensor
uploaded and normalised into the VAE's input.

Contract (a mixin of :class:`~shardsmith.encode.stage.EncodeStage`, which sets the attributes used:
``device``, ``batch_size``, ``seconds``, ``vae``, ``_copy_stream``)
- ``stage(frames)``: uint8 ``[F, H, W, 3]`` arrays of one bucket -> one ``[B, F, H, W, 3]`` tensor,
  page-locked on a GPU; padded to ``batch_size`` (repeating the last item) when ``pads()``.
  Stacks on one intra-op thread (the decode workers hold the cores). A batch holding JPEGs passed on
  undecoded (``images.decoder`` gpu) is staged as a :class:`~shardsmith.encode.gpu_decode.StagedImages`
  instead, decoded on the device by ``_to_input``.
- ``pads()``: ``pad_batches`` when set, else whether the device is a GPU or the VAE runs packages
  (:mod:`~shardsmith.encode.packaged_encoder`; decided in the warm-up, before any batch is staged).
- ``_to_input(host)``: the staged batch on the model's device as ``[B, 3, F, H, W]`` (``[B, 3, H, W]``
  for an image VAE) in ``[-1, 1]``, contiguous; on a GPU the upload runs on a side stream that the
  compute stream waits for.
"""

from __future__ import annotations

import threading
import time
import warnings

import numpy as np
import torch

from shardsmith.encode.gpu_decode import StagedImages, decode_rows
from shardsmith.encode.host_threads import one_intra_op_thread
from shardsmith.transform.jpeg_pass import EncodedImage


def _spend_read_only_warning() -> None:
    """stage() wraps decoded frames with ``torch.from_numpy`` only to read them (stacking copies).
    Frames that Pillow or PyAV hand out read-only make torch warn, once per process, that writing
    to them is undefined: that once-only warning is spent here, silently."""
    a = np.zeros(1, dtype=np.uint8)
    a.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.from_numpy(a)


_spend_read_only_warning()


class HostStaging:
    pad_batches: bool | None = None  # None: pad short batches on a GPU only (see stage)
    _PREPARE_LOCK = threading.Lock()  # seconds["prepare"] is booked by the calling thread and the staging one

    def _book_prepare(self, seconds: float) -> None:
        with self._PREPARE_LOCK:
            self.seconds["prepare"] += seconds

    def pads(self) -> bool:
        """Whether short batches are padded to ``batch_size``: then every batch has one shape, so an
        item's result does not depend on its batch-mates (the finisher may batch across units), and a
        compiled image VAE's packages (one per shape) are one per bucket."""
        if self.pad_batches is not None:
            return self.pad_batches
        packages = getattr(getattr(self, "vae", None), "packages", None)  # (a stage made without __init__: none)
        return self.device == "cuda" or (packages is not None and packages.active)

    def stage(self, frames: list) -> "torch.Tensor | StagedImages":
        """Host side of one batch: uint8 frames -> one ``[B, F, H, W, 3]`` tensor (page-locked on a GPU
        machine, so the upload runs at full speed and asynchronously). On a GPU a short batch is
        padded to ``batch_size``: with cudnn.benchmark every new batch shape costs a fresh
        autotuning pass, far more than the padded work (per-item results do not depend on their
        batch-mates). Callers may stage batch k+1 while batch k is on the GPU."""
        t0 = time.perf_counter()
        self.bind_device()  # page-locked memory on models.device's GPU, not on GPU 0
        if self.pads() and len(frames) < self.batch_size:
            frames = list(frames) + [frames[-1]] * (self.batch_size - len(frames))
        if any(isinstance(f, EncodedImage) for f in frames):  # JPEGs to decode on the device (images.decoder)
            self._book_prepare(time.perf_counter() - t0)
            return StagedImages(list(frames))
        # (torch.from_numpy refuses negative strides, e.g. a flipped view: such a frame is copied first)
        views = [torch.from_numpy(f if min(f.strides, default=0) >= 0 else np.ascontiguousarray(f)) for f in frames]
        # stacked by torch, which copies with the GIL released (np.stack's per-array Python steps each
        # wait for the GIL while the encoder thread launches kernels; BENCHMARKS.md has the figures);
        # on a GPU straight into page-locked memory (torch's host allocator caches these blocks)
        host = torch.empty((len(views), *views[0].shape), dtype=views[0].dtype, pin_memory=self.device == "cuda")
        with one_intra_op_thread():  # the decode workers hold the cores (see one_intra_op_thread)
            torch.stack(views, out=host)
        self._book_prepare(time.perf_counter() - t0)
        return host

    def _to_input(self, host: torch.Tensor) -> torch.Tensor:
        """Staged uint8 -> [B, 3, F, H, W] (or [B, 3, H, W]) in [-1, 1] on the model's device
        (uint8 crosses PCIe: 4x fewer bytes than float32, and the GPU does the arithmetic)."""
        if isinstance(host, StagedImages):  # decoded on the device (encode/gpu_decode.py)
            t0 = time.perf_counter()
            x = decode_rows(host, self.vae.device)[:, None]  # [B, 1, H, W, 3]
            self.seconds["decode"] = self.seconds.get("decode", 0.0) + time.perf_counter() - t0
        else:
            x = self._upload(host)
        # converted and laid out contiguously in one pass (the permute's channels-last strides send cuDNN to
        # slower kernels for these VAEs), then scaled in place: per element the same arithmetic as ever
        x = x.permute(0, 4, 1, 2, 3).to(self.vae.torch_dtype, memory_format=torch.contiguous_format)
        x = x.div_(127.5).sub_(1.0)  # [B, 3, F, H, W]
        if self.vae.spec.kind == "image_vae":
            if x.shape[2] != 1:
                raise ValueError(f"an image VAE takes 1-frame buckets, got {x.shape[2]} frames")
            x = x[:, :, 0]  # (a view of a contiguous tensor along a dimension of one: contiguous)
        return x

    def _upload(self, host: torch.Tensor) -> torch.Tensor:
        """The staged batch on the model's device. On a GPU the copy runs on a side stream that the
        compute stream then waits for: a batch launched ahead crosses PCIe while the batch before
        it still computes, instead of queueing its copy behind that batch's kernels."""
        if torch.device(self.vae.device).type != "cuda":
            return host.to(self.vae.device)
        if self._copy_stream is None:
            self._copy_stream = torch.cuda.Stream()
        compute = torch.cuda.current_stream()
        with torch.cuda.stream(self._copy_stream):
            x = host.to(self.vae.device, non_blocking=True)
        compute.wait_stream(self._copy_stream)
        x.record_stream(compute)  # allocated on the copy stream, used on the compute stream
        return x
