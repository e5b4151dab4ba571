"""The one thread that runs an encode stage's model work, and the warm-up run on it.

Contract (a mixin of :class:`~shardsmith.encode.stage.EncodeStage`, which sets the attributes used)
- ``device_thread()`` / ``submit(fn, *args)``: every model call of the stage (warm-up, launched
  batches) runs on one thread, started on first use with the stage's intra-op thread count pinned;
  ``close()`` stops it once its queued work is done.
- ``warm_up(buckets, stop, audio_seconds=...)`` (``warm_up_for(recipe, stop)``: the recipe's shapes): one padded batch of zeros per bucket shape, one of
  prompts, and one of silent waveforms per audio duration, on that thread before the real batches;
  books nothing (``models.compile: auto`` on a GPU times a second, eager pass of each shape: its pace),
  changes no output, never raises for a model error (it is logged and returned in the
  info dict, ``warm_up_info``). On a GPU it then sets ``text_beside``: whether the text encoder's batches run on
  a stream of their own (memory_plan.text_fits_beside).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import torch

from shardsmith.encode.host_threads import pin_intra_op_threads

log = logging.getLogger(__name__)


class DeviceThread:
    def device_thread(self):
        """The one thread that runs this stage's model work: the warm-up and every launched batch
        (``submit``). cuDNN's autotuned plans are kept per thread in torch (its execution plans are
        not thread-safe), so a warm-up on another thread, or a thread per output or split, would
        tune again at its first batch (BENCHMARKS.md has the cost)."""
        if self._thread is None:
            from concurrent.futures import ThreadPoolExecutor

            self._closing.clear()
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shardsmith-encode",
                                              initializer=self._device_thread_init)
        return self._thread

    def _device_thread_init(self) -> None:
        pin_intra_op_threads(self._threads)
        self.bind_device()  # models.device cuda:N: GPU N is this thread's current device

    def submit(self, fn, *args):
        """Run ``fn(*args)`` on the device thread; returns its future."""
        return self.device_thread().submit(fn, *args)

    def close(self) -> None:
        """Stop the device thread once its queued work is done (a later submit starts a new one); a wait
        on it (``models.compile: auto`` waiting for the plan) ends now."""
        self._closing.set()
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None
        packages = getattr(getattr(self, "vae", None), "packages", None)
        if packages is not None:  # (the loaders remove the files they unpacked; loaded again if used again)
            packages.close()

    def warm_up(self, buckets, stop=None, timed: bool = False, audio_seconds=()) -> dict[str, Any]:
        """One padded batch of zeros per bucket shape through the VAE, one of full-length prompts
        through the text encoder and one of silent waveforms per ``audio_seconds`` duration through the
        audio encoder, so that cuDNN's autotuning, FFT plans, the compiled graph's build or cache load
        (``models.compile="on"``) and the device's first allocations happen before the first real batch,
        e.g. while the build plans. Runs on the device thread (waited for here), where the batches will
        run. Nothing is booked as a batch and no output depends on it. ``stop`` (an Event), checked after
        each shape: the shapes not warmed are tuned on first use as before. A failure here (say out of
        memory) is logged and left to the real batches, which retry; returns what was done."""
        return self.submit(self._warm_up, buckets, stop, timed, tuple(audio_seconds)).result()

    def warm_up_for(self, recipe, stop=None, timed: bool = False) -> dict[str, Any]:
        """:meth:`warm_up` with the shapes ``recipe`` knows before its plan: its VAE's bucket shapes
        (``Recipe.encode_buckets``) and its audio durations (``Recipe.audio_encode_seconds``)."""
        from shardsmith.transform.buckets import parse_buckets

        buckets = recipe.encode_buckets()  # geometry.buckets and each latent_zip's square
        return self.warm_up(parse_buckets(buckets) if buckets else [], stop=stop, timed=timed,
                            audio_seconds=recipe.audio_encode_seconds())

    def _text_fits_beside(self) -> bool:
        """After a GPU warm-up that measured both: whether the text encoder's batches may run on a stream of their
        own beside the VAE's (:func:`~shardsmith.encode.memory_plan.text_fits_beside`, on the memory this process
        may use); on the VAE's stream they wait for the VAE batch before them (transformers reads a mask's values
        on the host), and the device for the host's launches."""
        from shardsmith.encode.memory_plan import gpu_free_total, text_fits_beside

        if getattr(self.text_encoder, "model", None) is None:  # (none, or answered from the text pass's cache)
            return False
        usable, _ = gpu_free_total(getattr(self, "device_index", None))
        return text_fits_beside(getattr(self, "memory", []), usable)

    def _peak_start(self) -> int:
        """On a GPU: reset the peak statistic and return the bytes allocated now (the resident weights)."""
        if self.device != "cuda":
            return 0
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()

    @staticmethod
    def _timed(fn) -> float:
        t = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return time.perf_counter() - t

    def _measured(self, name: str, shape: str, base: int, seconds: float | None) -> None:
        """Book one model's figures (:class:`~shardsmith.encode.memory_plan.ModelMemory`): its weights, and on
        a GPU the peak of the batch just run above what was resident before it."""
        from shardsmith.encode.memory_plan import ModelMemory, param_bytes

        enc = {"vae": self.vae, "text": self.text_encoder, "audio": getattr(self, "audio_vae", None)}[name]
        peak = None
        if self.device == "cuda":
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - base
        prov = enc.provenance
        labels = [prov.config_name, prov.weights, getattr(enc.spec, "quantize", None)]
        what = f"{getattr(enc.spec, 'family', prov.cls)} ({', '.join(x for x in labels if x)}) {shape}"
        params = param_bytes(enc.model) if enc.model is not None else enc.weight_bytes  # (a VAE not built yet)
        mem = ModelMemory(name, what, self.batch_size, params, None if peak is None else params + peak, seconds)
        self.memory = [m for m in getattr(self, "memory", []) if (m.name, m.what) != (name, what)] + [mem]

    def _warm_audio(self, audio_seconds, stopped, timed: bool, done: list[str]) -> None:
        """One batch of silent waveforms per duration through the audio encoder (its mel's FFT plans
        and kernels are per waveform length), each appended to ``done``, up to the one under way when
        stopped."""
        from shardsmith.transform.audio import num_samples

        audio = self.audio_vae
        for seconds in audio_seconds:
            waves = [np.zeros((2, num_samples(seconds, audio.settings.sample_rate)), np.float32)] * self.batch_size
            base = self._peak_start()
            audio.encode(waves)
            self._measured("audio", f"{seconds:g} s", base, self._timed(lambda: audio.encode(waves)) if timed else None)
            done.append(f"{seconds:g} s")
            if stopped():
                break

    def _warm_shape(self, host: torch.Tensor, shape: str, timed: bool) -> None:
        """One batch of ``host`` through the VAE (compiled when it is; the compile's first batch booked). Timed
        as a second pass when ``timed`` and, eager under ``models.compile: auto`` on a GPU, for auto's pace."""
        base = self._peak_start()
        t = time.perf_counter()
        self.vae.encode(self._to_input(host)).detach().to("cpu")
        dt = time.perf_counter() - t
        eager = not self.compile_info["compiled"]
        pace = eager and self.compile_setting == "auto" and self.device == "cuda"
        seconds = self._timed(lambda: self.vae.encode(self._to_input(host)).detach().to("cpu")) \
            if timed or pace else None
        if seconds is not None and eager:
            self._eager_s[tuple(host.shape)] = seconds
        self._measured("vae", f"@ {shape}", base, seconds)
        if self._compile_pending is not None:
            self._compiled_first_batch(dt)

    def _warm_up(self, buckets, stop=None, timed: bool = False, audio_seconds=()) -> dict[str, Any]:
        info: dict[str, Any] = {"shapes": [], "seconds": 0.0}
        stopped = stop.is_set if stop is not None else (lambda: False)
        t0 = time.perf_counter()
        try:
            for b in buckets if self.vae is not None else ():  # (a text-only stage: no VAE to warm)
                host = torch.zeros((self.batch_size, b.frames, b.height, b.width, 3), dtype=torch.uint8,
                                   pin_memory=self.device == "cuda")
                self._maybe_compile(host, real=False)  # "on" compiles now; "auto" once this shape's pace is known
                self._warm_shape(host, str(b), timed)
                if not self.compile_info.get("decided"):  # auto: decided now, from the pace just measured
                    self._maybe_compile(host, real=False)
                    if self.compile_info["compiled"]:
                        self._warm_shape(host, str(b), timed)  # this shape's compiled graph, now too
                info["shapes"].append(str(b))
                if stopped():
                    break
            # (a text encoder answered from the text pass's cache, models.offload text-first, has no model to warm)
            if getattr(self.text_encoder, "model", None) is not None and not stopped():
                spec = self.text_encoder.spec  # a batch of prompts as long as the encoder takes
                prompts = [" ".join(["warm-up"] * spec.max_length)] * self.batch_size
                base = self._peak_start()
                self.text_encoder.encode(prompts, device="cpu")
                self._measured("text", f"{spec.max_length} tokens", base,
                               self._timed(lambda: self.text_encoder.encode(prompts, device="cpu")) if timed else None)
                info["text"] = True
            if getattr(self, "audio_vae", None) is not None and audio_seconds and not stopped():
                self._warm_audio(audio_seconds, stopped, timed, info.setdefault("audio", []))
            if self.device == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()  # from here: the run's own peak (describe's memory block)
                self.text_beside = self._text_fits_beside()
        except Exception as exc:  # noqa: BLE001 - the real batches handle (and report) what failed here
            log.warning("encoder warm-up stopped: %s", exc)
            info["error"] = f"{type(exc).__name__}: {exc}"
            if self.device == "cuda":
                torch.cuda.empty_cache()
        info["seconds"] = round(time.perf_counter() - t0, 3)
        self.warm_up_info = info
        return info
