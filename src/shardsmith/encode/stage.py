"""The encode stage of a build: batches of bucketed pixels through the VAE, captions through
the text encoder, in the main process (one model copy per device).

Contract
- ``EncodeStage.from_recipe(recipe)`` loads the models the recipe's outputs need, once (on
  ``models.device``; ``auto``: ``cuda`` when present, else CPU): the VAE only for a latent output
  (``recipe.LATENT_OUTPUTS``), the text encoder whenever ``models.text`` is set; with a VAE it
  validates the buckets against the loaded VAE's compression (errors name the nearest valid
  values; ``precheck`` did the same from its config). With ``offload`` deciding ``text-first`` (a build's
  ``models.offload``) the text encoder loads first, encodes every caption of the plan into the build's
  text cache and is freed before the VAE is built; ``text`` then answers from that cache, bit for bit
  what the encoder gave. Without a VAE (``vae`` None: e.g. a
  ``prompt_wds`` output alone) only ``text`` is usable.
- ``latents(pixels)`` takes a list of uint8 ``[F, H, W, 3]`` arrays of ONE bucket and returns
  one latent per item: ``[C, F', H', W']`` for video VAEs, ``[C, H', W']`` for image VAEs.
  An out-of-memory error halves the batch (down to 1, then tiled decoding where the model
  supports it) instead of failing the run.
- ``launch(staged, n, captions)`` starts one batch (latents, and text embeddings when captions
  are given) and returns a :class:`PendingBatch`; on a GPU it returns once the work is queued, so
  the next batch queues behind it. ``PendingBatch.result()`` waits and gives the per-item outputs.
- ``text(captions)`` returns ``(emb [L, D], mask [L])`` per caption (``""`` for none), cached
  by caption within the stage (at most ``TEXT_CACHE_BYTES`` beyond the current batch).
- ``stage_audio(waves)`` / ``launch_audio(staged)`` / ``audio_result(launched)``: audio latents of
  processed waveforms (``models.audio_vae``): stacked and started on the device thread (after the
  batch's VAE launch), waited for (and booked) when the batch is serialised.
- ``describe()`` gives the manifest block: each model's spec and provenance, with
  ``"random-weights"`` plain to see.
- A model's ``pretrained`` that cannot be loaded (not cached while offline, an unknown id, no network, a folder
  ``from_pretrained`` cannot read) is a :class:`~shardsmith.precheck.ModelLoadError` naming
  ``models.<key>.pretrained`` and the fix (exit code 2), never the libraries' traceback; ``~`` is expanded.
- diffusers or transformers installed but failing on import (a broken dependency: a shared library that cannot be
  opened) is a :class:`BrokenPackageError` (exit code 2) naming the package, the models that need it, the import
  error's last line and the reinstall of the version shardsmith pins (:func:`import_libraries`).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from shardsmith.encode import coordesc_cache, cuda_warm, packaged_encoder
from shardsmith.encode.caption_cache import CaptionCache, text_entry
from shardsmith.encode.compile_decision import CompileDecision
from shardsmith.encode.encoders import ENCODER_NAMES, Encoder, held
from shardsmith.encode.device_thread import DeviceThread
from shardsmith.encode.model_identity import clean_config, model_identity
from shardsmith.encode.pending import PendingBatch
from shardsmith.encode.staging import HostStaging
from shardsmith.encode.text import load_text_encoder, to_pinned
from shardsmith.encode.text_memory import encode_halving
from shardsmith.encode.throughput import BatchRecord, LaunchRecord, Throughput
from shardsmith.encode.vae import load_vae
from shardsmith.encode.vae_config import FAMILIES
from shardsmith.errors import UserError
from shardsmith.precheck import MissingPackageError, check_hub_cache, load_errors, local_path, resolve_device
from shardsmith.recipe import LATENT_OUTPUTS
from shardsmith.transform.buckets import parse_buckets, validate_buckets

if TYPE_CHECKING:
    from shardsmith.encode.audio_vae import LaunchedAudio, StagedAudio

log = logging.getLogger(__name__)

GIL_SWITCH_S = 0.0001  # the interpreter's switch interval while a GPU stage exists (see from_recipe)


def default_batch(video: bool, device: str) -> int:
    """``models.batch_size`` when unset: 2 video / 32 image items on a GPU, 1 / 8 on the CPU."""
    return (2 if video else 32) if device == "cuda" else (1 if video else 8)


def _load_text(t, place):
    """``models.text`` loaded on ``place`` (quantised when asked)."""
    with load_errors("text", t):
        text = load_text_encoder(t.family, pretrained=local_path(t.pretrained), config=t.config,
                                 max_length=t.max_length, dtype=t.dtype, device=place)
    if t.quantize != "none":
        from shardsmith.encode.quantize import quantize_text

        quantize_text(text, t.quantize)
    return text


def _needs_transformers(recipe) -> bool:
    """Whether the build loads a model of transformers (a text encoder, a teacher's)."""
    m = recipe.models
    return m.text is not None or m.teacher is not None


def _lean_text(recipe) -> bool:
    """Whether the build's only transformers model is a text encoder that is not quantised: transformers' core is
    then imported without scipy, torchao and peft, after the VAEs' classes without transformers
    (encode/diffusers_import.py)."""
    m = recipe.models
    return m.text is not None and m.teacher is None and m.text.quantize == "none"


class BrokenPackageError(MissingPackageError):
    """A package the build's models need is installed, but its import fails (a broken or half-installed
    dependency: a shared library that is not there, a module of another version)."""


#: the packages :func:`import_libraries` imports (the frames of their own code name the one that broke)
_LIBRARIES = ("diffusers", "transformers")


def _import_failure(exc: BaseException) -> BaseException | None:
    """The error that made an import fail, if ``exc`` is one: an ``ImportError`` or ``OSError`` (a shared library
    that cannot be opened), itself or behind it (diffusers' lazy module raises ``RuntimeError("Failed to import
    diffusers.<module> ...")`` from the error); None for anything else."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (ImportError, OSError)):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def _culprit(root: BaseException, importing: str) -> str:
    """The package whose import broke: the last of :data:`_LIBRARIES` whose own code the failure passed through
    (diffusers imports transformers where it is installed), else ``importing``."""
    name, tb = importing, root.__traceback__
    while tb is not None:
        top = str(tb.tb_frame.f_globals.get("__name__", "")).split(".")[0]
        if top in _LIBRARIES:
            name = top
        tb = tb.tb_next
    return name


def broken_package(recipe, importing: str, exc: BaseException) -> BrokenPackageError | None:
    """The :class:`BrokenPackageError` of ``exc``, raised while ``importing`` (diffusers or transformers) was
    imported for ``recipe``'s models, when ``exc`` is an import failure (:func:`_import_failure`): naming the
    package, the models that need it, the error's last line and the fix (the version shardsmith pins,
    reinstalled); None otherwise (the caller raises ``exc`` as it is)."""
    root = _import_failure(exc)
    if root is None or isinstance(exc, UserError):
        return None
    from shardsmith.precheck import _built, _pinned

    package = _culprit(root, importing)
    lines = [line.strip() for line in str(root).splitlines() if line.strip()]
    last = f"{type(root).__name__}: {lines[-1]}" if lines else type(root).__name__
    last = last if len(last) <= 300 else last[:297] + "..."
    built = [b for b in _built(recipe) if package == "diffusers" or b.startswith(("models.text ", "models.teacher "))]
    who = (" and ".join([", ".join(built[:-1]), built[-1]] if len(built) > 1 else built)
           or "the build's models")
    return BrokenPackageError(
        f"{who} need{'s' if len(built) <= 1 else ''} the {package} package, which is installed but cannot be "
        f"imported ({last}): it, or a package it depends on, is broken or half-installed; reinstall the version "
        f"shardsmith pins with: pip install --force-reinstall {_pinned(package)} "
        f"(python -c 'import {package}' shows the whole error)")


def import_libraries(recipe) -> None:
    """diffusers and transformers imported as the build's models need them, before any model is built (the load,
    and ``models.offload: auto``'s estimate, which builds them on the meta device first): the VAEs' classes
    first, without transformers where the build needs none or only a text encoder's, then transformers' core
    (encode/diffusers_import.py). Their per-load progress bars are turned off: our own say what is happening.
    An installed package whose import fails (a broken dependency) is a :class:`BrokenPackageError` naming it,
    the error's last line and the reinstall (exit code 2), not the import's traceback."""
    from shardsmith.encode import diffusers_import

    importing = "diffusers"
    try:
        lean = not _needs_transformers(recipe) or _lean_text(recipe)
        if _needs_vae(recipe):
            diffusers_import.model_class(FAMILIES[recipe.models.vae.family]["cls"], lean=lean)
        if recipe.audio_outputs():
            from shardsmith.encode.audio_vae import CLS

            diffusers_import.model_class(CLS, lean=lean)
        from diffusers.utils import logging as dlog

        dlog.disable_progress_bar()
        if _needs_transformers(recipe):
            importing = "transformers"
            diffusers_import.transformers_core(lean=_lean_text(recipe))
            from transformers.utils import logging as tlog

            tlog.disable_progress_bar()
    except Exception as exc:
        broken = broken_package(recipe, importing, exc)
        if broken is None:
            raise
        raise broken from exc


def _load_vae(recipe, place: str):
    v = recipe.models.vae
    with load_errors("vae", v):
        return load_vae(v.family, pretrained=local_path(v.pretrained), subfolder=v.subfolder, revision=v.revision,
                        config=v.config, dtype=v.dtype, device=place, store=v.store)


def _needs_vae(recipe) -> bool:
    return recipe.models.vae is not None and any(isinstance(o, LATENT_OUTPUTS) for o in recipe.outputs)


def _packaged_vae(recipe, place: str, device: str):
    """The VAE of a build whose compiled packages are all in the cache (encode/packaged_encoder.py), without its
    model; None where that does not apply (the VAE is then loaded)."""
    m = recipe.models
    if not _needs_vae(recipe) or m.compile == "off":
        return None
    if m.compile == "auto" and device != "cuda":  # (auto stays eager off the GPU: the model is needed)
        return None
    buckets = parse_buckets(recipe.encode_buckets() or [])
    if any(b.frames != 1 for b in buckets):
        return None
    batch = m.batch_size or default_batch(False, device)
    shapes = [(batch, 3, b.height, b.width) for b in buckets]

    def build():
        import_libraries(recipe)
        return _load_vae(recipe, place)

    return packaged_encoder.from_cache(recipe, place, shapes, build)


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


class EncodeStage(DeviceThread, HostStaging, CompileDecision, CaptionCache, Throughput):
    """Each job of the stage is a module of its own: the device thread and warm-up
    (:mod:`~shardsmith.encode.device_thread`), host staging (:mod:`~shardsmith.encode.staging`), the
    compile decision (:mod:`~shardsmith.encode.compile_decision`), the caption cache
    (:mod:`~shardsmith.encode.caption_cache`) and the throughput report
    (:mod:`~shardsmith.encode.throughput`); this class holds their state, loads the models and
    runs the batches (synchronously with out-of-memory halving, or launched ahead on a GPU)."""

    def __init__(self, vae, text, *, batch_size: int | None, device: str, compile: str = "off",
                 device_index: int | None = None, audio_vae=None, teacher=None, sampler=None,
                 distill_seed: int = 0, negative_prompt: str = "", negative=None):
        if compile not in ("auto", "on", "off"):
            raise ValueError(f"compile must be 'auto', 'on' or 'off', got {compile!r}")
        self.vae, self.text_encoder, self.device = vae, text, device
        self.audio_vae = audio_vae  # encode.audio_vae.AudioVae when an output writes audio latents
        # shardsmith distill: the teacher, its sampling settings (distill.trajectories.Sampler), the seed
        # every sample's seed derives from, and the negative prompt of classifier-free guidance
        self.teacher, self.sampler = teacher, sampler
        self.distill_seed, self.negative_prompt = distill_seed, negative_prompt
        self.negative = negative  # (emb [L, D], None): distill.text source's neg_prompt_emb.npy
        self.device_index = device_index  # models.device cuda:N (``device`` is then "cuda"); see bind_device
        self.compile_setting = compile
        self.compile_info: dict[str, Any] = {"setting": compile, "compiled": False, "reason": None}
        self.coordesc_base = coordesc_cache.counts()  # (the manifest counts this build's reuse and tuning)
        self._compile_pending: dict[str, Any] | None = None  # set between compile() and its first batch
        self.launched = 0  # items started so far (written by the encoder thread only)
        self._eager_s: dict[tuple[int, ...], float] = {}  # an eager batch's seconds per staged shape (compile auto)
        self._closing = threading.Event()  # set by close(): a wait on the device thread ends
        self.text_beside = False  # the text encoder's batches on a stream of their own (set by a GPU warm-up)
        self.batch_size = batch_size or default_batch(vae is not None and vae.spec.kind == "video_vae", device)
        self._text_cache: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.oom_retries = 0
        self._text_oom = [0]  # text batches halved after running out of memory (encode/text_memory.py)
        self.seconds = {"prepare": 0.0, "encode": 0.0, "text": 0.0, "audio": 0.0, "teacher": 0.0}  # where time goes
        self.batches: list[BatchRecord] = []  # every encoded batch
        self.timeline: list[LaunchRecord] = []  # launched batches, for encode.idle.gpu_idle
        self.audio_batches: list[BatchRecord] = []  # the audio encoder's batches (audio_steady_state)
        self.audio_timeline: list[LaunchRecord] = []  # ... launched on a GPU
        self._thread = None  # the device thread (device_thread())
        self._threads = torch.get_num_threads()  # its intra-op threads (see pin_intra_op_threads)
        self.created = time.perf_counter()
        self.warm_up_info: dict[str, Any] | None = None
        self._copy_stream = None  # a GPU's host->device copies (made on first use)

    @classmethod
    def from_recipe(cls, recipe, offload=None) -> "EncodeStage":
        """``offload``: an :class:`~shardsmith.encode.offload.OffloadRun` whose ``decided`` mode is
        ``text-first``: the text encoder is loaded first, runs the text pass (:mod:`~shardsmith.encode.text_pass`)
        and is freed before the VAE is built; the stage's text encoder is then the cache
        (:class:`~shardsmith.encode.text_cache.CachedText`)."""
        m = recipe.models
        check_hub_cache(recipe)  # offline, a hub id not in the cache is said now, before any model library loads
        device = resolve_device(m.device, "models.device")
        place, index = device, None  # where the models go; cuda:N's N
        if device.startswith("cuda:"):
            index, device = int(device.split(":", 1)[1]), "cuda"
            torch.cuda.set_device(index)  # this (loading) thread's streams and events; the others: bind_device
        if device == "cuda":
            # cuDNN's kernels by its heuristics, deterministic ones: the autotuner's choice varies from process
            # to process (the LTX-2 VAE's latents then differ in their last bits between two runs, a resume or
            # two --gpus workers); measured on the H200 it bought 0.1-0.4 % (BENCHMARKS.md §12)
            torch.backends.cudnn.benchmark = False
            torch.backends.cudnn.deterministic = True
            # the encoder thread releases and re-takes the GIL around each of a batch's hundreds of
            # kernel launches, and each time waits up to the interpreter's switch interval while the
            # main thread handles worker results: shorten it (default 5 ms)
            sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_S))
        # the GPU's libraries (cuDNN, cuBLAS, cuFFT) load on a thread of their own while the loads below import
        # diffusers and transformers, instead of at the first batch (encode/cuda_warm.py); None off a GPU
        warm = cuda_warm.start(recipe, place)
        vae = _packaged_vae(recipe, place, device)  # a compiled image VAE whose packages are cached: no model yet
        if vae is None or _needs_transformers(recipe):
            import_libraries(recipe)
        text = decision = text_memory = None
        text_oom = [0]
        if offload is not None and offload.decided is not None and offload.decided.mode == "text-first" \
                and m.text is not None:
            from shardsmith.encode.offload import text_batch, with_pass
            from shardsmith.encode.text_pass import text_first

            text, counts, text_memory = text_first(lambda: _load_text(m.text, place), recipe, offload, device,
                                                   text_batch(recipe, device), counter=text_oom)
            decision = with_pass(offload.decided, counts)
        if vae is None and _needs_vae(recipe):
            vae = _load_vae(recipe, place)
            packaged_encoder.attach(vae, recipe, place)
            buckets = recipe.encode_buckets()  # geometry.buckets and each latent_zip's square
            if buckets:
                validate_buckets(parse_buckets(buckets), vae.spec.spatial, vae.spec.temporal)
        if m.text is not None and text is None:
            text = _load_text(m.text, place)
        audio_vae = None
        if recipe.audio_outputs():
            from shardsmith.encode.audio_vae import load_audio_vae

            a = m.audio_vae
            with load_errors("audio_vae", a):
                audio_vae = load_audio_vae(a.family, pretrained=local_path(a.pretrained), subfolder=a.subfolder,
                                           revision=a.revision, config=a.config, dtype=a.dtype, device=place,
                                           vocoder=False)
        teacher = sampler = negative = None
        if m.teacher is not None and recipe.distill is not None:
            from shardsmith.distill.trajectories import Sampler
            from shardsmith.encode.teacher import check_pairing, load_teacher

            tm = m.teacher
            with load_errors("teacher", tm if tm.family != "callable" else None):
                teacher = load_teacher(tm.family, entry_point=tm.entry_point, parameterisation=tm.parameterisation,
                                       pretrained=local_path(tm.pretrained), subfolder=tm.subfolder,
                                       revision=tm.revision, config=tm.config, dtype=tm.dtype, device=place)
            check_pairing(teacher.spec, text.spec.dim if text is not None else None, recipe.distill.shape)
            sampler = Sampler.from_recipe(recipe)
            if recipe.distill.text == "source" and recipe.distill.guidance != 1.0:
                from shardsmith.distill.sources import source_negative

                negative = source_negative(recipe)
        stage = cls(vae, text, batch_size=m.batch_size, device=device, compile=m.compile, device_index=index,
                    audio_vae=audio_vae, teacher=teacher, sampler=sampler,
                    distill_seed=recipe.distill.seed if recipe.distill is not None else 0,
                    negative_prompt=recipe.distill.negative_prompt if recipe.distill is not None else "",
                    negative=negative)
        if decision is not None:  # text-first: the pass's counts, halvings and memory
            stage.offload, stage._text_oom = decision, text_oom
            if text_memory is not None:
                stage.memory = [text_memory]
        if vae is not None:  # the settled images.decoder (encode/decoder_choice.settle), named in the manifest
            from shardsmith.encode.decoder_choice import MANIFEST_NAMES

            stage.image_decoder = MANIFEST_NAMES.get(recipe.images.decoder)
        if warm is not None:
            warm.join()  # (done by now: its ops are tiny; nothing of it runs beside a real batch)
        return stage

    def bind_device(self) -> None:
        """With ``models.device: cuda:N``, make GPU N the calling thread's current CUDA device (torch's
        streams, events and caches use the current device, which is per thread); else nothing."""
        index = getattr(self, "device_index", None)  # (a stage made without __init__ has none)
        if index is not None and torch.cuda.current_device() != index:
            torch.cuda.set_device(index)

    # ---------------------------------------------------------------- pixels -> latents
    def encode_staged(self, host: torch.Tensor, n: int | None = None) -> list[torch.Tensor]:
        """Latents of a staged batch (its first ``n`` items: the rest is padding)."""
        n = host.shape[0] if n is None else n
        self._maybe_compile(host)
        try:
            t1 = time.perf_counter()
            z = self.vae.encode(self._to_input(host)).detach().to("cpu")  # one device->host copy (waits)
            t2 = time.perf_counter()
            self.seconds["encode"] += t2 - t1
            if self._compile_pending is not None:
                self._compiled_first_batch(t2 - t1)
            self.batches.append(BatchRecord(t2, n, t2 - t1, host.shape[0]))
            self.launched += n
            return [t.clone() for t in z[:n].unbind(0)]
        except Exception as exc:  # noqa: BLE001 - only OOM is retried
            if not _is_oom(exc):
                raise
            self.oom_retries += 1
            if self.device == "cuda":
                torch.cuda.empty_cache()
            if n > 1:
                half = n // 2
                log.warning("out of memory encoding %d items; retrying as %d + %d", n, half, n - half)
                return self.encode_staged(host[:half]) + self.encode_staged(host[half:n])
            model = self.vae.net()
            if hasattr(model, "enable_tiling") and not getattr(model, "use_tiling", False):
                log.warning("out of memory on a single item; retrying with tiled encoding")
                model.enable_tiling()
                return self.encode_staged(host[:1])
            raise

    # ---------------------------------------------------------------- launched batches
    def launch(self, host: torch.Tensor, n: int | None = None, captions: list[str] | None = None, *,
               staged_at: float | None = None) -> "PendingBatch":
        """Start a staged batch (its first ``n`` items) and, with ``captions``, their text embeddings.

        On a GPU this returns as soon as the work is queued (results come back through
        page-locked memory), so the caller can stage and launch the next batch while this one
        runs: the device never waits for the host between batches. Elsewhere, and for the first
        batch after compiling (whose time is measured), it runs to completion first. Either way
        :meth:`PendingBatch.result` gives the per-item outputs. ``staged_at``: when the caller had
        the batch staged (``perf_counter``), for :meth:`steady_state`'s account of the GPU's idle time."""
        begin = time.perf_counter()
        n = host.shape[0] if n is None else n
        self._maybe_compile(host)
        pend = PendingBatch(self, n, captions, rows=host.shape[0])
        if self.device != "cuda" or self._compile_pending is not None:
            pend.latents = self.encode_staged(host, n)
        else:
            self._timing_reference()
            try:
                start = torch.cuda.Event(enable_timing=True)
                start.record()
                z = self.vae.encode(self._to_input(host)).detach()
                pend.z_host = to_pinned(z[:n])
                pend.vae_end = torch.cuda.Event(enable_timing=True)
                pend.vae_end.record()
                pend.start = start
                self.launched += n
            except Exception as exc:  # noqa: BLE001 - only OOM is retried (halving, in encode_staged)
                if not _is_oom(exc):
                    raise
                pend.z_host = None
                pend.latents = self.encode_staged(host, n)
        if captions is not None:  # tokenised here, while the device runs the VAE batch
            beside = self.device == "cuda" and self.text_beside and pend.z_host is not None
            with self._text_stream() if beside else contextlib.nullcontext():
                self._launch_captions(pend, captions)
            if beside:
                torch.cuda.current_stream().wait_stream(self._txt_stream)  # (the batch is done when both are)
        if self.device == "cuda":
            pend.done_event = torch.cuda.Event(enable_timing=True)
            pend.done_event.record()
        pend.host_times = (begin if staged_at is None else staged_at, begin, time.perf_counter())
        return pend

    def _text_stream(self):
        """The text encoder's own CUDA stream (made at first use; ``text_beside``), entered: its batch queues
        beside the VAE batch launched before it instead of after it, so the host's wait inside the text
        forward (transformers reads a mask's values) is for the text stream's earlier work only."""
        if getattr(self, "_txt_stream", None) is None:
            self._txt_stream = torch.cuda.Stream()
        return torch.cuda.stream(self._txt_stream)

    def launch_text(self, captions: list[str]) -> "PendingBatch":
        """Start the text embeddings of a batch without pixels (``prompt_wds``, audio-only items).

        On a GPU this returns once the forward pass and its copy into page-locked memory are queued,
        so the next batch's captions are tokenised and queued while this one runs (a synchronous
        :meth:`text` leaves the device idle for every batch's tokenising and copies). The result is
        ``PendingBatch.result_batch()``: ``(None, [(emb [L, D], mask [L]), ...])`` in ``captions``'
        order; device time is booked under ``seconds["text"]`` once it is resolved."""
        begin = time.perf_counter()
        pend = PendingBatch(self, len(captions), captions, rows=len(captions))
        pend.text_only = True
        if self.device == "cuda":
            pend.start = torch.cuda.Event(enable_timing=True)
            pend.start.record()
        self._launch_captions(pend, captions, book=self.device != "cuda")  # a GPU's: the stream's time
        if self.device == "cuda":
            pend.done_event = torch.cuda.Event(enable_timing=True)
            pend.done_event.record()
        pend.host_times = (begin, begin, time.perf_counter())
        return pend

    def _launch_captions(self, pend: "PendingBatch", captions: list[str], book: bool = True) -> None:
        """Queue the embeddings of ``captions`` not in the cache (``pend.todo``; cached ones are taken
        now, ``pend.known``: the cache may be pruned before the batch completes). ``book``: add the host
        side's time to ``seconds["text"]`` (not where the stream's time is booked instead: a launch
        blocks once the device's queue is full, and would count that time twice)."""
        if self.text_encoder is None:
            raise RuntimeError("no text encoder configured (models.text)")
        pend.known = {c: self._text_cache[c] for c in captions if c in self._text_cache}
        todo = sorted({c for c in captions if c not in pend.known})
        pend.todo = todo
        if todo:
            t0 = time.perf_counter()
            pend.text_emb = encode_halving(self.text_encoder, todo, device="cpu", non_blocking=True,
                                           counter=getattr(self, "_text_oom", None), rows=self.text_rows())
            if book:
                self.seconds["text"] += time.perf_counter() - t0  # host side (tokenise + queue)

    def _timing_reference(self) -> None:
        """Record, once, a CUDA event whose wall-clock time is known (``self._ref``): batch end
        events become wall times."""
        if getattr(self, "_ref", None) is None:
            torch.cuda.synchronize()
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            ev.synchronize()
            self._ref = (ev, time.perf_counter())

    def _complete(self, p: "PendingBatch") -> tuple[list[torch.Tensor], list[tuple[torch.Tensor, torch.Tensor]] | None]:
        if p.text_only:  # launch_text: no latents; the text encoder's device time booked
            if p.start is not None:
                self.seconds["text"] += p.start.elapsed_time(p.done_event) / 1e3
        elif p.latents is None:  # launched asynchronously: book its device time now that it is done
            gpu_s = p.start.elapsed_time(p.vae_end) / 1e3
            ref, ref_wall = self._ref
            done_at = ref_wall + ref.elapsed_time(p.vae_end) / 1e3
            self.seconds["encode"] += gpu_s
            self.batches.append(BatchRecord(done_at, p.n, gpu_s, p.rows))
            gpu_start = ref_wall + ref.elapsed_time(p.start) / 1e3
            gpu_end = ref_wall + ref.elapsed_time(p.done_event) / 1e3  # text encoder included
            self.timeline.append(LaunchRecord(*p.host_times, gpu_start, gpu_end))
            p.latents, p.z_host = p.z_host, None  # the batch (page-locked); result() cuts it per item
        if p.captions is None:
            return p.latents, None
        new = {}
        if p.todo:
            te = p.text_emb
            new = {c: text_entry(te, j) for j, c in enumerate(p.todo)}
            p.text_emb = None
            self._text_cache.update(new)
            self._prune_text_cache(p.captions)
        got = {**p.known, **new}
        return p.latents, [got[c] for c in p.captions]

    def stage_audio(self, waves: list) -> "StagedAudio | None":
        """The host side of an audio batch (:meth:`AudioVae.stage <shardsmith.encode.audio_vae.AudioVae.stage>`),
        on the calling thread (the finisher's staging thread on a GPU, else the device thread); None when no
        item has a waveform."""
        if all(w is None for w in waves):
            return None
        if self.audio_vae is None:
            raise RuntimeError("no audio encoder configured (models.audio_vae)")
        t0 = time.perf_counter()
        self.bind_device()  # page-locked memory on models.device's GPU (the staging thread is not the device thread)
        staged = self.audio_vae.stage(waves)
        staged.staged_at = time.perf_counter()
        self._book_prepare(staged.staged_at - t0)
        return staged

    def launch_audio(self, staged: "StagedAudio") -> "LaunchedAudio":
        """Start a staged audio batch on the device thread (:meth:`AudioVae.launch`); its time is
        booked by :meth:`audio_result`."""
        t0 = time.perf_counter()
        if self.device == "cuda":
            self._timing_reference()
        launched = self.audio_vae.launch(staged)
        t1 = time.perf_counter()
        launched.host_seconds = t1 - t0
        launched.host_times = (staged.staged_at if staged.staged_at is not None else t0, t0, t1)
        return launched

    def audio_result(self, launched: "LaunchedAudio") -> list:
        """Wait for a launched audio batch: one latent per item (None where it had no waveform); books
        its time under ``seconds["audio"]`` (on the caller's thread, once): on a GPU the stream's time
        from the batch's first to its last queued step, elsewhere the synchronous launch."""
        out = launched.result()
        if not launched.booked:
            launched.booked = True
            items = sum(z is not None for z in out)
            if launched.start is None:
                self.seconds["audio"] += launched.host_seconds
                self.audio_batches.append(BatchRecord(time.perf_counter(), items, launched.host_seconds, items))
                return out
            gpu_s = launched.device_seconds()
            self.seconds["audio"] += gpu_s
            ref, ref_wall = self._ref
            gpu_start = ref_wall + ref.elapsed_time(launched.start) / 1e3
            gpu_end = ref_wall + ref.elapsed_time(launched.done_event) / 1e3
            self.audio_batches.append(BatchRecord(gpu_end, items, gpu_s, items))
            self.audio_timeline.append(LaunchRecord(*launched.host_times, gpu_start, gpu_end))
        return out

    def trajectories(self, item_ids: list[str], texts: list[tuple[torch.Tensor, ...]],
                     shape: tuple[int, ...] | None = None) -> list:
        """The teacher's trajectories (:class:`~shardsmith.distill.trajectories.Trajectory`) for a batch
        of prompts (their items' ids give the seeds; ``texts``: ``(emb [L, D], mask [L])`` each), on the
        calling thread (the finisher calls it on the device thread). On a GPU a short batch is padded
        to ``batch_size`` (:meth:`pads`): a sample's trajectory does not depend on its batch-mates.
        ``shape``: the batch's sample shape (default ``distill.shape``). The negative prompt's embedding:
        ``negative`` when given at construction (a source's ``neg_prompt_emb.npy``), else the text encoder's."""
        from shardsmith.distill.trajectories import sample_seed

        if self.teacher is None:
            raise RuntimeError("no teacher configured (models.teacher)")
        t0 = time.perf_counter()
        seeds = [sample_seed(self.distill_seed, i) for i in item_ids]
        cond = torch.stack([t[0] for t in texts])
        mask = torch.stack([t[1] for t in texts]) if len(texts[0]) > 1 and texts[0][1] is not None else None
        negative = None
        if self.sampler.guidance != 1.0:
            if getattr(self, "negative", None) is not None:
                negative = self.negative
            else:
                neg = self.text([self.negative_prompt])[0]
                negative = (neg[0], neg[1] if len(neg) > 1 else None)
        out = self.sampler.run(self.teacher, seeds, cond, mask, negative,
                               pad_to=self.batch_size if self.pads() else None, shape=shape)
        self.seconds["teacher"] += time.perf_counter() - t0
        self.launched += len(item_ids)
        return out

    def latents(self, frames: list[np.ndarray]) -> list[torch.Tensor]:
        """Encode any number of frames in batches of ``batch_size`` (stage + encode, one after the other)."""
        out: list[torch.Tensor] = []
        for i in range(0, len(frames), self.batch_size):
            chunk = frames[i:i + self.batch_size]
            out += self.encode_staged(self.stage(chunk), len(chunk))
        return out

    # ---------------------------------------------------------------- manifest
    def describe(self) -> dict[str, Any]:
        def prov(p) -> dict[str, Any]:
            out = p.to_dict()
            out["config"] = clean_config(out.get("config") or {})
            return out

        index = getattr(self, "device_index", None)
        device = self.device if index is None else f"cuda:{index}"
        d: dict[str, Any] = {"device": device, "batch_size": self.batch_size,
                             "compile": {k: v for k, v in self.compile_info.items() if k != "decided"},
                             "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
                             "steady_state": self.steady_state(), "warm_up": self.warm_up_info}
        if self.compile_info.get("compiled"):  # (Inductor's coordinate-descent winners reused or tuned here)
            d["compile"]["coordesc_cache"] = coordesc_cache.counts(since=self.coordesc_base)  # (this build's)
        packages = getattr(self.vae, "packages", None)
        if packages is not None and packages.active:  # compiled ahead of time: loaded or built here, and whether
            d["compile"].update(packages.describe(), model_built=self.vae.model is not None)  # diffusers' model was
        if self.audio_batches:
            d["audio_steady_state"] = self.audio_steady_state()
        offload = getattr(self, "offload", None)
        if getattr(self, "memory", None) and self.device == "cuda":  # measured in the warm-up (memory_plan.py)
            from shardsmith.encode.memory_plan import memory_block

            apart = ("text",) if offload is not None and offload.mode == "text-first" else ()
            measured = max([torch.cuda.max_memory_allocated()]  # the text pass's peak too, measured before
                           + [m.peak_bytes for m in self.memory if m.name in apart and m.peak_bytes is not None])
            beside = ("text",) if self.text_beside else ()
            d["memory"] = memory_block(self.memory, measured, apart=apart, beside=beside)
        if offload is not None:  # models.offload as settled for this build (encode/offload.py)
            d["offload"] = offload.to_dict()
        if getattr(self, "image_decoder", None):  # JPEGs decoded on the device (absent: on the CPU, by Pillow)
            d["image_decoder"] = self.image_decoder
        if getattr(self, "_text_oom", [0])[0]:  # text batches halved after running out of memory
            d["text_oom_halvings"] = self._text_oom[0]
        for name, enc in self.encoders.items():
            d[name] = {"spec": enc.spec.to_dict(), "provenance": prov(enc.provenance)}
        d["random_weights"] = sorted(k for k in self.encoders if d[k]["provenance"].get("weights") == "random-weights")
        return d

    @property
    def encoders(self) -> dict[str, Encoder]:
        """The loaded encoders by name (:mod:`shardsmith.encode.encoders`)."""
        return held(self.vae, self.text_encoder, getattr(self, "audio_vae", None), getattr(self, "teacher", None))

    def stamp(self, recipe) -> dict[str, Any]:
        """What a cache depends on: model identities (not devices or batch sizes), geometry and, when
        set, the LoRA trigger every caption starts with (absent otherwise: older stamps still match)."""
        d = self.describe()
        # the audio encoder only when held (older stamps, without audio, still match)
        out = {**{name: model_identity(d[name]) if name in d else None for name in ENCODER_NAMES
                  if name not in ("audio_vae", "teacher") or name in d},
               "buckets": list(recipe.geometry.buckets), "fps": recipe.geometry.fps}
        if getattr(recipe, "mode", None):  # the LTX training mode the tree is for (verify reads it)
            from shardsmith.formats.precomputed import MODE_KEY, tree_mode

            out[MODE_KEY] = tree_mode(recipe.mode, bool(recipe.audio_outputs()))
        if recipe.audio.skip:
            out["audio"] = "skipped"
        elif recipe.audio.durations:
            out["audio_durations"] = list(recipe.audio.durations)
        if "audio_vae" in d and recipe.audio.resampler != "ffmpeg":  # absent for ffmpeg: older trees' stamps
            out["audio_resampler"] = recipe.audio.resampler
        if getattr(self, "image_decoder", None):  # pixels decoded on the device differ from Pillow's
            out["image_decoder"] = self.image_decoder
        if getattr(recipe, "lora_trigger", None):
            out["lora_trigger"] = recipe.lora_trigger
        return out
