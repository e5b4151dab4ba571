"""The encode stage of a build: batches of bucketed pixels through the VAE, captions through
the text encoder, in the main process (one model copy per device).

Contract
- ``EncodeStage.from_recipe(recipe)`` loads the recipe's models once (on ``models.device``;
  ``auto``: ``cuda`` when present, else CPU) and validates the buckets against the loaded VAE's
  compression (errors name the nearest valid values; ``precheck`` did the same from its config).
- ``latents(pixels)`` takes a list of uint8 ``[F, H, W, 3]`` arrays of ONE bucket and returns
  one latent per item: ``[C, F', H', W']`` for video VAEs, ``[C, H', W']`` for image VAEs.
  An out-of-memory error halves the batch (down to 1, then tiled decoding where the model
  supports it) instead of failing the run.
- ``launch(staged, n, captions)`` starts one batch (latents, and text embeddings when captions
  are given) and returns a :class:`PendingBatch`; on a GPU it returns once the work is queued, so
  the next batch queues behind it. ``PendingBatch.result()`` waits and gives the per-item outputs.
- ``text(captions)`` returns ``(emb [L, D], mask [L])`` per caption (``""`` for none), cached
  by caption within the stage (at most ``TEXT_CACHE_BYTES`` beyond the current batch).
- ``describe()`` gives the manifest block: each model's spec and provenance, with
  ``"random-weights"`` plain to see.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
import time
import warnings
from typing import Any

import numpy as np
import torch

from shardsmith.encode.host_threads import one_intra_op_thread, pin_intra_op_threads
from shardsmith.encode.idle import gpu_idle
from shardsmith.encode.text import load_text_encoder, to_pinned
from shardsmith.encode.vae import load_vae
from shardsmith.precheck import resolve_device
from shardsmith.transform.buckets import parse_buckets, validate_buckets

log = logging.getLogger(__name__)


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

GIL_SWITCH_S = 0.0001  # the interpreter's switch interval while a GPU stage exists (see from_recipe)


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


class EncodeStage:
    def __init__(self, vae, text, *, batch_size: int | None, device: str, compile: str = "off"):
        if compile not in ("auto", "on", "off"):
            raise ValueError(f"compile must be 'auto', 'on' or 'off', got {compile!r}")
        self.vae, self.text_encoder, self.device = vae, text, device
        self.compile_setting = compile
        self.compile_backend = "inductor"  # tests use "eager" / "aot_eager" to exercise the path quickly
        self.compile_info: dict[str, Any] = {"setting": compile, "compiled": False, "reason": None}
        self._compile_pending: dict[str, Any] | None = None  # set between compile() and its first batch
        self.launched = 0  # items started so far (written by the encoder thread only)
        self._target: int | None = None  # ``launched`` once every expected item is started (expect())
        video = vae.spec.kind == "video_vae"
        self.batch_size = batch_size or ((2 if video else 32) if device == "cuda" else (1 if video else 8))
        self._text_cache: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.oom_retries = 0
        self.seconds = {"prepare": 0.0, "encode": 0.0, "text": 0.0}  # where encode-stage time goes
        # per batch: (finished at, items, encode seconds, rows on the device: items + padding)
        self.batches: list[tuple[float, int, float, int]] = []
        self.timeline: list[tuple[float, ...]] = []  # launched batches, for encode.idle.gpu_idle
        self._thread = None  # the device thread (device_thread())
        self._threads = torch.get_num_threads()  # its intra-op threads (see pin_intra_op_threads)
        self.created = time.perf_counter()
        self.warm_up_info: dict[str, Any] | None = None
        self._copy_stream = None  # a GPU's host->device copies (made on first use)

    @classmethod
    def from_recipe(cls, recipe) -> "EncodeStage":
        m = recipe.models
        device = resolve_device(m.device, "models.device")
        if device == "cuda":
            torch.backends.cudnn.benchmark = True  # fixed bucket shapes: let cuDNN pick its fastest kernels
            # the encoder thread releases and re-takes the GIL around each of a batch's hundreds of
            # kernel launches, and each time waits up to the interpreter's switch interval while the
            # main thread handles worker results: shorten it (default 5 ms)
            sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_S))
        try:  # our own progress bars say what is happening; the libraries' per-load bars are noise
            from diffusers.utils import logging as dlog
            from transformers.utils import logging as tlog

            tlog.disable_progress_bar()
            dlog.disable_progress_bar()
        except ImportError:  # pragma: no cover - both are dependencies of the encoders
            pass
        v = m.vae
        vae = load_vae(v.family, pretrained=v.pretrained, subfolder=v.subfolder, revision=v.revision,
                       config=v.config, dtype=v.dtype, device=device, store=v.store)
        buckets = parse_buckets(recipe.geometry.buckets)
        validate_buckets(buckets, vae.spec.spatial, vae.spec.temporal)
        text = None
        if m.text is not None:
            t = m.text
            text = load_text_encoder(t.family, pretrained=t.pretrained, config=t.config, max_length=t.max_length,
                                     dtype=t.dtype, device=device)
        return cls(vae, text, batch_size=m.batch_size, device=device, compile=m.compile)

    # ---------------------------------------------------------------- warm-up
    def device_thread(self):
        """The one thread that runs this stage's model work: the warm-up and every launched batch
        (``submit``). cuDNN's autotuned plans are kept per thread in torch (its execution plans are
        not thread-safe), so a warm-up on another thread, or a thread per output or split, would
        tune again at its first batch (on the H200 the first eager batch took 1.03 s to queue)."""
        if self._thread is None:
            from concurrent.futures import ThreadPoolExecutor

            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shardsmith-encode",
                                              initializer=pin_intra_op_threads, initargs=(self._threads,))
        return self._thread

    def submit(self, fn, *args):
        """Run ``fn(*args)`` on the device thread; returns its future."""
        return self.device_thread().submit(fn, *args)

    def close(self) -> None:
        """Stop the device thread once its queued work is done (a later submit starts a new one)."""
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None

    def warm_up(self, buckets, stop=None) -> dict[str, Any]:
        """One padded batch of zeros per bucket shape through the VAE, so that cuDNN's autotuning,
        the compiled graph's build or cache load (``models.compile="on"``) and the device's first
        allocations happen before the first real batch, e.g. while the build plans. Runs on the
        device thread (waited for here), where the batches will run. Nothing is
        booked as a batch and no output depends on it. ``stop`` (an Event), checked after each
        shape: the shapes not warmed are tuned on first use as before. A failure here (say out of
        memory) is logged and left to the real batches, which retry; returns what was done."""
        return self.submit(self._warm_up, buckets, stop).result()

    def _warm_up(self, buckets, stop=None) -> dict[str, Any]:
        info: dict[str, Any] = {"shapes": [], "seconds": 0.0}
        stopped = stop.is_set if stop is not None else (lambda: False)
        t0 = time.perf_counter()
        try:
            for b in buckets:
                host = torch.zeros((self.batch_size, b.frames, b.height, b.width, 3), dtype=torch.uint8,
                                   pin_memory=self.device == "cuda")
                self._maybe_compile(host)  # "on" compiles now; "auto" needs eager batches first
                t = time.perf_counter()
                self.vae.encode(self._to_input(host)).detach().to("cpu")
                dt = time.perf_counter() - t
                if self._compile_pending is not None:
                    self._compiled_first_batch(dt)
                info["shapes"].append(str(b))
                if stopped():
                    break
            if self.text_encoder is not None and not stopped():
                self.text_encoder.encode(["warm-up"], device="cpu")
                info["text"] = True
        except Exception as exc:  # noqa: BLE001 - the real batches handle (and report) what failed here
            log.warning("encoder warm-up stopped: %s", exc)
            info["error"] = f"{type(exc).__name__}: {exc}"
            if self.device == "cuda":
                torch.cuda.empty_cache()
        info["seconds"] = round(time.perf_counter() - t0, 3)
        self.warm_up_info = info
        return info

    def mark_start(self, at: float | None = None) -> None:
        """The build started encoding at ``at`` (``perf_counter()``; default now):
        ``steady_state``'s times count from there."""
        self.created = time.perf_counter() if at is None else at

    # ---------------------------------------------------------------- pixels -> latents
    pad_batches: bool | None = None  # None: pad short batches on a GPU only (see stage)

    def pads(self) -> bool:
        """Whether short batches are padded to ``batch_size``: then every batch has one shape, so an
        item's result does not depend on its batch-mates (the finisher may batch across units)."""
        return self.device == "cuda" if self.pad_batches is None else self.pad_batches

    def stage(self, frames: list[np.ndarray]) -> torch.Tensor:
        """Host side of one batch: uint8 frames -> one ``[B, F, H, W, 3]`` tensor (page-locked on a GPU
        machine, so the upload runs at full speed and asynchronously). On a GPU a short batch is
        padded to ``batch_size``: with cudnn.benchmark every new batch shape costs a fresh
        autotuning pass, far more than the padded work (per-item results do not depend on their
        batch-mates). Callers may stage batch k+1 while batch k is on the GPU."""
        t0 = time.perf_counter()
        if self.pads() and len(frames) < self.batch_size:
            frames = list(frames) + [frames[-1]] * (self.batch_size - len(frames))
        # (torch.from_numpy refuses negative strides, e.g. a flipped view: such a frame is copied first)
        views = [torch.from_numpy(f if min(f.strides, default=0) >= 0 else np.ascontiguousarray(f)) for f in frames]
        # stacked by torch, which copies with the GIL released (np.stack's per-array Python steps each
        # wait for the GIL while the encoder thread launches kernels: ~10x slower under contention);
        # on a GPU straight into page-locked memory (torch's host allocator caches these blocks)
        host = torch.empty((len(views), *views[0].shape), dtype=views[0].dtype, pin_memory=self.device == "cuda")
        with one_intra_op_thread():  # the decode workers hold the cores (see one_intra_op_thread)
            torch.stack(views, out=host)
        self.seconds["prepare"] += time.perf_counter() - t0
        return host

    def _to_input(self, host: torch.Tensor) -> torch.Tensor:
        """Staged uint8 -> [B, 3, F, H, W] (or [B, 3, H, W]) in [-1, 1] on the model's device
        (uint8 crosses PCIe: 4x fewer bytes than float32, and the GPU does the arithmetic)."""
        x = self._upload(host)
        x = x.permute(0, 4, 1, 2, 3).to(self.vae.torch_dtype).div_(127.5).sub_(1.0)  # [B, 3, F, H, W]
        if self.vae.spec.kind == "image_vae":
            if x.shape[2] != 1:
                raise ValueError(f"an image VAE takes 1-frame buckets, got {x.shape[2]} frames")
            x = x[:, :, 0]
        # the permute leaves channels-last strides, which send cuDNN to slower kernels for these VAEs
        return x.contiguous()

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

    # ---------------------------------------------------------------- torch.compile
    def expect(self, items: int, *, since: int | None = None) -> None:
        """The build says how many items are still to encode (``compile="auto"`` weighs it):
        ``items`` counted from now, or from the moment ``launched`` was ``since`` (a build whose
        plan runs ahead learns its total only once the plan ends, while batches are in flight).
        Safe to call while the encoder thread runs: one attribute is written."""
        self._target = (self.launched if since is None else since) + items

    @property
    def remaining(self) -> int | None:
        """Items still to encode, when the build said (:meth:`expect`); else None."""
        return None if self._target is None else self._target - self.launched

    def _maybe_compile(self, host: torch.Tensor) -> None:
        """``on``: compile before the first batch. ``auto``: on a GPU, after
        ``DECIDE_AFTER_BATCHES`` full eager batches, compile if the rest of the run repays it."""
        from shardsmith.encode import compile as cc

        info = self.compile_info
        if info["compiled"] or info.get("decided"):
            return
        if self.compile_setting == "off":
            info.update(decided=True, reason="off in the recipe (models.compile)")
            return
        if self.compile_setting == "auto":
            if self.device != "cuda":
                info.update(decided=True, reason="auto: stays eager off the GPU")
                return
            full = self._full_batch_times()
            if len(full) < cc.DECIDE_AFTER_BATCHES or self.remaining is None:
                return
            rate = self.batch_size / full[len(full) // 2]
            key = self._compile_key(host, cc)
            yes, why = cc.compile_pays(self.remaining, rate, cc.is_warm(key))
            info.update(decided=True, reason="auto: " + why, eager_items_per_s=round(rate, 1))
            if not yes:
                return
        else:
            info.update(decided=True, reason="on in the recipe (models.compile)")
            key = self._compile_key(host, cc)
        self._compile(host, key, cc)

    def _full_batch_times(self) -> list[float]:
        """Sorted encode seconds of the batches after the first (which autotunes) that ran
        ``batch_size`` rows on the device: full ones, and short ones padded to that shape (a GPU's
        only batches when units, e.g. shards bounded by bytes, are smaller than a batch)."""
        return sorted(dt for _, _, dt, rows in self.batches[1:] if rows == self.batch_size)

    def _compile_key(self, host: torch.Tensor, cc) -> str:
        dev = torch.cuda.get_device_name(0) if self.device == "cuda" else "cpu"
        return cc.cache_key(_identity(self.describe()["vae"]), tuple(host.shape[1:]), self.vae.spec.dtype,
                            torch.__version__, dev, f"{self.compile_backend}:{cc.COMPILE_MODE}")

    def _compile(self, host: torch.Tensor, key: str, cc) -> None:
        d = cc.use_cache_dir()
        try:  # one compiled graph per bucket shape; the default limit (8) would fall back to eager
            import torch._dynamo

            torch._dynamo.config.recompile_limit = max(getattr(torch._dynamo.config, "recompile_limit", 8), 64)
        except (ImportError, AttributeError):  # pragma: no cover - older torch
            pass
        warm = cc.is_warm(key, d)
        self.vae.compile(mode=cc.COMPILE_MODE, backend=self.compile_backend)
        backend = self.compile_backend if isinstance(self.compile_backend, str) else \
            getattr(self.compile_backend, "__name__", repr(self.compile_backend))
        self.compile_info.update(compiled=True, mode=cc.COMPILE_MODE, backend=backend, cache=str(d),
                                 warm_cache=warm, compiled_at_batch=len(self.batches))
        self._compile_pending = {"key": key, "dir": d}
        log.info("compiling the VAE encoder (%s, %s cache %s)", cc.COMPILE_MODE, "warm" if warm else "cold", d)

    def _compiled_first_batch(self, dt: float) -> None:
        from shardsmith.encode import compile as cc

        pend, self._compile_pending = self._compile_pending, None
        eager = self._full_batch_times() or [0.0]
        self.compile_info["compile_s"] = round(max(0.0, dt - eager[len(eager) // 2]), 2)
        cc.mark_warm(pend["key"], {"compile_s": self.compile_info["compile_s"], "at": time.time()}, pend["dir"])

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
            self.batches.append((t2, n, t2 - t1, host.shape[0]))
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
            model = self.vae.model
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
        if captions is not None:
            if self.text_encoder is None:
                raise RuntimeError("no text encoder configured (models.text)")
            # cached captions are taken now: the cache may be pruned before this batch completes
            pend.known = {c: self._text_cache[c] for c in captions if c in self._text_cache}
            todo = sorted({c for c in captions if c not in pend.known})
            pend.todo = todo
            if todo:  # tokenised here, while the device runs the VAE batch just queued
                t0 = time.perf_counter()
                pend.text_emb = self.text_encoder.encode(todo, device="cpu", non_blocking=True)
                self.seconds["text"] += time.perf_counter() - t0  # host side (tokenise + queue)
        if self.device == "cuda":
            pend.done_event = torch.cuda.Event(enable_timing=True)
            pend.done_event.record()
        pend.host_times = (begin if staged_at is None else staged_at, begin, time.perf_counter())
        return pend

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
        if p.latents is None:  # launched asynchronously: book its device time now that it is done
            gpu_s = p.start.elapsed_time(p.vae_end) / 1e3
            ref, ref_wall = self._ref
            done_at = ref_wall + ref.elapsed_time(p.vae_end) / 1e3
            self.seconds["encode"] += gpu_s
            self.batches.append((done_at, p.n, gpu_s, p.rows))
            gpu_start = ref_wall + ref.elapsed_time(p.start) / 1e3
            gpu_end = ref_wall + ref.elapsed_time(p.done_event) / 1e3  # text encoder included
            self.timeline.append((*p.host_times, gpu_start, gpu_end))
            p.latents, p.z_host = p.z_host, None  # the batch (page-locked); result() cuts it per item
        if p.captions is None:
            return p.latents, None
        new = {}
        if p.todo:
            te = p.text_emb
            new = {c: (te.emb[j].clone(), te.mask[j].clone()) for j, c in enumerate(p.todo)}
            p.text_emb = None
            self._text_cache.update(new)
            self._prune_text_cache(p.captions)
        got = {**p.known, **new}
        return p.latents, [got[c] for c in p.captions]

    TEXT_CACHE_BYTES = 512 << 20  # a T5-XXL embedding at 512 tokens is 4 MiB: ~128 of them

    def _prune_text_cache(self, keep: list[str]) -> None:
        """Bounded host memory on long runs with unique captions: past ``TEXT_CACHE_BYTES`` (or
        4096 entries) only the captions of the current batch stay."""
        nbytes = sum(e.nbytes + m.nbytes for e, m in self._text_cache.values())
        if nbytes > self.TEXT_CACHE_BYTES or len(self._text_cache) > 4096:
            k = set(keep)
            self._text_cache = {c: v for c, v in self._text_cache.items() if c in k}

    def latents(self, frames: list[np.ndarray]) -> list[torch.Tensor]:
        """Encode any number of frames in batches of ``batch_size`` (stage + encode, one after the other)."""
        out: list[torch.Tensor] = []
        for i in range(0, len(frames), self.batch_size):
            chunk = frames[i:i + self.batch_size]
            out += self.encode_staged(self.stage(chunk), len(chunk))
        return out

    # ---------------------------------------------------------------- captions -> embeddings
    def text(self, captions: list[str]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        if self.text_encoder is None:
            raise RuntimeError("no text encoder configured (models.text)")
        t0 = time.perf_counter()
        todo = sorted({c for c in captions if c not in self._text_cache})
        bs = max(1, self.batch_size * 4)
        for i in range(0, len(todo), bs):
            chunk = todo[i:i + bs]
            te = self.text_encoder.encode(chunk, device="cpu")  # one device->host copy per chunk
            for j, c in enumerate(chunk):
                self._text_cache[c] = (te.emb[j].clone(), te.mask[j].clone())
        self._prune_text_cache(captions)
        self.seconds["text"] += time.perf_counter() - t0
        return [self._text_cache[c] for c in captions]

    def steady_state(self) -> dict[str, Any] | None:
        """Throughput between the first and the last encoded batch (model load, planning and the
        first batch's autotuning left out), and the median encode time of the largest batches
        (units smaller than a batch, e.g. shards bounded by bytes, make every batch partial)."""
        if len(self.batches) < 3:
            return None
        largest = max(n for _, n, *_ in self.batches)
        full = [b for b in self.batches if b[1] == largest]
        t_first, t_last = self.batches[0][0], self.batches[-1][0]
        items = sum(n for _, n, *_ in self.batches[1:])
        times = sorted(dt for _, _, dt, _ in full)
        return {"items_per_s": round(items / (t_last - t_first), 1) if t_last > t_first else None,
                "first_batch_done_s": round(t_first - self.created, 3),  # after the outputs started (mark_start)
                "last_batch_done_s": round(t_last - self.created, 3),
                "median_batch_encode_s": round(times[len(times) // 2], 4), "batches": len(self.batches),
                "first_batch": self._first_batch(), "gpu_idle": gpu_idle(self.timeline),
                "median_batch_gpu_s": self._median_gpu_s()}

    def _median_gpu_s(self) -> float | None:
        """Median device time of a launched batch, the text encoder's part included (the encode time
        above is the VAE's alone)."""
        spans = sorted(end - start for *_, start, end in self.timeline)
        return round(spans[len(spans) // 2], 4) if spans else None

    def _first_batch(self) -> dict[str, float] | None:
        """When the first launched batch was staged, queued and started on the device, counted like
        ``first_batch_done_s`` from the start of the outputs (pixels late, or models late?). A batch
        run synchronously right after a compile is not a launched one."""
        if not self.timeline:
            return None
        staged, begin, end, start, _ = min(self.timeline, key=lambda r: r[3])
        return {k: round(v - self.created, 3) for k, v in
                (("staged_s", staged), ("launch_begun_s", begin), ("queued_s", end), ("gpu_start_s", start))}

    # ---------------------------------------------------------------- manifest
    def describe(self) -> dict[str, Any]:
        def prov(p) -> dict[str, Any]:
            out = p.to_dict()
            out["config"] = _clean_config(out.get("config") or {})
            return out

        d: dict[str, Any] = {"device": self.device, "batch_size": self.batch_size,
                             "compile": {k: v for k, v in self.compile_info.items() if k != "decided"},
                             "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
                             "steady_state": self.steady_state(), "warm_up": self.warm_up_info,
                             "vae": {"spec": self.vae.spec.to_dict(), "provenance": prov(self.vae.provenance)}}
        if self.text_encoder is not None:
            d["text"] = {"spec": self.text_encoder.spec.to_dict(), "provenance": prov(self.text_encoder.provenance)}
        d["random_weights"] = sorted(k for k in ("vae", "text") if k in d and
                                     d[k]["provenance"].get("weights") == "random-weights")
        return d

    def stamp(self, recipe) -> dict[str, Any]:
        """What a cache depends on: model identities (not devices or batch sizes) and geometry."""
        d = self.describe()
        return {"vae": _identity(d["vae"]), "text": _identity(d["text"]) if "text" in d else None,
                "buckets": list(recipe.geometry.buckets), "fps": recipe.geometry.fps}


class PendingBatch:
    """A batch started by :meth:`EncodeStage.launch`. ``done()`` polls without waiting;
    ``result()`` waits (the GIL is released while it does), books the batch's device time and
    returns ``(latents, texts)``: per item a ``[C, (F'), H', W']`` host tensor and, when captions
    were given, ``(emb [L, D], mask [L])``; each item owns its memory (no view of the batch).
    ``result_batch()`` gives the latents as one ``[n, ...]`` tensor instead."""

    def __init__(self, stage: EncodeStage, n: int, captions: list[str] | None, rows: int):
        self.stage, self.n, self.captions = stage, n, captions
        self.rows = rows  # rows on the device: the n items and their padding
        self.latents: list[torch.Tensor] | None = None  # set at once by the synchronous paths
        self.z_host = self.start = self.vae_end = self.done_event = self.text_emb = None
        self.host_times: tuple[float, float, float] | None = None  # staged, launch begun, launch queued
        self.known: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.todo: list[str] = []
        self._out = None

    def done(self) -> bool:
        return self._out is not None or self.done_event is None or self.done_event.query()

    def _resolve(self):
        if self._out is None:
            if self.done_event is not None:
                self.done_event.synchronize()
            self._out = self.stage._complete(self)
        return self._out

    def result(self) -> tuple[list[torch.Tensor], list[tuple[torch.Tensor, torch.Tensor]] | None]:
        z, texts = self._resolve()
        if isinstance(z, torch.Tensor):  # one tensor per item, each with its own memory
            z = [t.clone() for t in z.unbind(0)]
            self._out = (z, texts)
        return z, texts

    def result_batch(self) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]] | None]:
        """Like :meth:`result`, but the latents as one host tensor ``[n, C, (F'), H', W']`` (no tensor
        per item: each is a torch call that gives up the GIL, which costs milliseconds a batch when
        the encoder thread wants it back)."""
        z, texts = self._resolve()
        return (z if isinstance(z, torch.Tensor) else torch.stack(z)), texts


def _clean_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """A model config without diffusers' bookkeeping keys (``_use_default_values`` is an unordered set)."""
    return {k: v for k, v in cfg.items() if not k.startswith("_")}


def _identity(model: dict[str, Any]) -> dict[str, Any]:
    """A short, stable identity of one model: enough to tell two caches apart, small enough to print."""
    spec, prov = model["spec"], model["provenance"]
    cfg = json.dumps(_clean_config(prov.get("config") or {}), sort_keys=True, default=str)
    return {"class": prov.get("cls"), "family": spec.get("family"), "weights": prov.get("weights"),
            "path_or_repo": prov.get("path_or_repo"), "subfolder": prov.get("subfolder"),
            "revision": prov.get("revision"), "weights_sha256": prov.get("weights_sha256"),
            "config": prov.get("config_name"), "config_sha256": hashlib.sha256(cfg.encode()).hexdigest()[:16],
            "store": spec.get("store"), "dtype": spec.get("dtype"), "max_length": spec.get("max_length")}
