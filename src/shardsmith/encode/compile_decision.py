"""Whether an encode stage compiles its VAE (``models.compile``: ``on``, ``off``, ``auto``), decided once, before
its first batch, and kept for the build.

Contract (a mixin of :class:`~shardsmith.encode.stage.EncodeStage`, which sets the attributes used)
- ``_maybe_compile(host, real=)``, called before every batch (``real=False``: the warm-up's): ``on`` compiles
  before the first batch; ``off`` never; ``auto`` follows the build's record when there is one, else stays eager
  off the GPU and, on a GPU, decides before the first real batch: in the warm-up (beside the plan) once it has
  timed an eager batch of a shape, else at the first real batch (timing one of its shape, on zeros); from that
  eager pace, the items the build encodes (:class:`~shardsmith.encode.compile_record.CompileRecord`'s
  ``planned``) and whether the compile cache is warm (:func:`~shardsmith.encode.compile.compile_pays`). While
  the plan runs ahead it waits for the plan until the items planned repay the compile, the plan ends, or
  :data:`WAIT_FOR_PLAN_S` passes (then the items planned so far decide). Every item of a build is thus encoded
  compiled or every one eager.
- ``compile_record`` (set by the build; None elsewhere): the decision is kept in the build's ledger, and a
  resume, or another ``--gpus`` worker, follows the one kept (the first to decide wins), so their batches are
  the same bytes. ``on`` and ``off`` are followed as set; where they differ from the record of a build that has
  written latents, the manifest says those differ from these in their last bits. Without a record ``auto``
  stays eager (it cannot know how many items follow).
- A compile with Inductor runs in its deterministic mode (``compile_info["deterministic"]``): every process
  compiles the same kernels, so a resumed or a second build's compiled batches are the same bytes.
- ``_compiled_first_batch(dt)`` books the first compiled batch's extra time and marks the
  compile cache warm for this model and shape.
"""

from __future__ import annotations

import logging
import time

import torch

from shardsmith.encode import aot_package as aot
from shardsmith.encode.compile_record import set_in_recipe
from shardsmith.encode.model_identity import model_identity

log = logging.getLogger(__name__)

WAIT_FOR_PLAN_S = 10.0  # most the first batch waits for a plan running ahead (a cold compile costs ~12 times more)
POLL_S = 0.1


class CompileDecision:
    compile_record = None  # encode.compile_record.CompileRecord: the build's (set by the build)
    compile_backend = "inductor"  # tests use "eager" / "aot_eager" to exercise the path quickly

    def _maybe_compile(self, host: torch.Tensor, real: bool = True) -> None:
        """Decide (once; kept in the build's record) and compile when decided so: ``on`` at once, ``auto`` in the
        warm-up or at the first real batch (see the module contract)."""
        from shardsmith.encode import compile as cc

        info = self.compile_info
        if info.get("decided"):
            return
        if self.compile_setting == "auto":
            if not real and not self._decides_in_warm_up(host):
                return  # the warm-up decides once it has measured this shape's eager pace for a build
            yes, why, extra = self._auto(host, cc)
            extra["decided_in"] = "first batch" if real else "warm-up"
        else:
            yes, why, extra = self.compile_setting == "on", set_in_recipe(self.compile_setting), {}
            kept = self.compile_record.keep({"compiled": yes, "reason": why}) if self.compile_record else None
            if kept is not None and kept["compiled"] != yes and self.compile_record.written():
                extra["note"] = (f"this build began {'compiled' if kept['compiled'] else 'eager'} ({kept['reason']}): "
                                 "the latents written before differ from these in their last bits")
                log.warning("models.compile: %s", extra["note"])
        info.update(decided=True, reason=why, **extra)
        if yes:
            self._compile(host, self._compile_key(host, cc), cc)

    def _decides_in_warm_up(self, host: torch.Tensor) -> bool:
        """``auto`` in a build's warm-up: decided now where the build kept a decision, or this shape's eager pace
        is measured, or its package is in the cache; else after an eager batch of it."""
        record = self.compile_record
        return record is not None and (record.kept() is not None or tuple(host.shape) in self._eager_s
                                       or self._package_warm(host))

    def _auto(self, host: torch.Tensor, cc) -> tuple[bool, str, dict]:
        """``auto``'s decision for the build, kept in its record: ``(compile?, why, figures for the manifest)``."""
        record = self.compile_record
        kept = record.kept() if record is not None else None
        if kept is not None:
            return kept["compiled"], f"auto: as this build began ({kept['reason']})", {}
        extra: dict = {}
        if self.device != "cuda":
            yes, why = False, "auto: stays eager off the GPU"
        elif record is None:
            return False, "auto: stays eager without a build's ledger (the items to encode are not known)", {}
        elif record.written():  # results and no record: a build begun before decisions were kept
            yes, why = False, "auto: eager, as this build began (before its decision was kept)"
        elif self._package_warm(host):  # loading a package costs about a batch: no eager pace to weigh it against
            yes = True
            kept = self.vae.packages.cached(self._input_shape(host))
            what = "package" if kept.suffix == aot.SUFFIX else "exported program (its package does not load here)"
            why = (f"auto: the compile cache holds this encoder's {what} for {'x'.join(map(str, host.shape[1:]))} "
                   f"at batch {host.shape[0]} ({kept}): compile")
        else:
            key = self._compile_key(host, cc)
            warm = cc.is_warm(key)
            seconds = self._eager_s.get(tuple(host.shape)) or self._time_eager(host)
            rate = self.batch_size / seconds
            items, waited = self._items_to_encode(lambda n: cc.compile_pays(n, rate, warm)[0])
            yes, why = cc.compile_pays(items, rate, warm)
            why, extra = "auto: " + why, {"eager_items_per_s": round(rate, 1), "waited_for_plan_s": waited}
        if record is None:
            return yes, why, extra
        kept = record.keep({"compiled": yes, "reason": why})  # another GPU worker may have decided first
        return kept["compiled"], kept["reason"], extra

    def _items_to_encode(self, pays) -> tuple[int, float]:
        """The items the build encodes, and the seconds waited for a plan running ahead: every one planned
        once the plan is complete; while it runs, those planned so far once ``pays(n)`` or after
        :data:`WAIT_FOR_PLAN_S` (or when the stage closes)."""
        t0 = time.perf_counter()
        while True:
            n, complete = self.compile_record.planned()
            waited = time.perf_counter() - t0
            if complete or pays(n) or waited >= WAIT_FOR_PLAN_S or self._closing.wait(POLL_S):
                return n, round(waited, 2)

    def _time_eager(self, host: torch.Tensor) -> float:
        """Seconds of one eager batch of ``host``'s shape (zeros; a first, tuning pass untimed): where the
        warm-up did not run that shape."""
        zeros = torch.zeros_like(host)
        self.vae.encode(self._to_input(zeros)).detach().to("cpu")
        self._eager_s[tuple(host.shape)] = s = self._timed(lambda: self.vae.encode(self._to_input(zeros)).detach().to("cpu"))
        return s

    def _packaged(self) -> bool:
        """Whether a compile runs the VAE's AOTInductor packages (encode/packaged_encoder.py): an image VAE that
        has them, compiled by Inductor."""
        packages = getattr(self.vae, "packages", None)
        return packages is not None and self.compile_backend == "inductor" and packages.usable()

    def _input_shape(self, host: torch.Tensor) -> tuple[int, ...]:
        """The VAE's input shape for a staged image batch ``[B, F=1, H, W, 3]``: ``[B, 3, H, W]``."""
        return (host.shape[0], 3, host.shape[2], host.shape[3])

    def _package_warm(self, host: torch.Tensor) -> bool:
        return self._packaged() and self.vae.packages.warm(self._input_shape(host))

    def _compile_key(self, host: torch.Tensor, cc) -> str:
        if self._packaged():
            return self.vae.packages.path(self._input_shape(host)).stem
        dev = torch.cuda.get_device_name() if self.device == "cuda" else "cpu"
        det = ":deterministic" if self._deterministic() else ""
        return cc.cache_key(model_identity(self.describe()["vae"]), tuple(host.shape[1:]), self.vae.spec.dtype,
                            torch.__version__, dev, f"{self.compile_backend}:{cc.COMPILE_MODE}{det}")

    def _deterministic(self) -> bool:
        """Whether this compile runs in Inductor's deterministic mode (the same bytes in every process); a
        package's own options say for a packaged VAE."""
        from shardsmith.encode import compile as cc

        if self._packaged():
            return self.vae.packages.deterministic()
        return self.compile_backend == "inductor" and bool(cc.inductor_options().get("deterministic"))

    def _compile(self, host: torch.Tensor, key: str, cc) -> None:
        d = cc.use_cache_dir()
        packaged = self._packaged()
        if not packaged:
            from shardsmith.encode import coordesc_cache

            coordesc_cache.keep()  # (Triton kernels' tuning reused from the cache, not redone, where this torch
            # loses it: the manifest's compile.coordesc_cache says what was reused)
            try:  # one compiled graph per bucket shape; the default limit (8) would fall back to eager
                import torch._dynamo

                torch._dynamo.config.recompile_limit = max(getattr(torch._dynamo.config, "recompile_limit", 8), 64)
            except (ImportError, AttributeError):  # pragma: no cover - older torch
                pass
        warm = self._package_warm(host) if packaged else cc.is_warm(key, d)
        self.vae.compile(mode=cc.COMPILE_MODE, backend=self.compile_backend)
        backend = "aot_inductor" if packaged else self.compile_backend if isinstance(self.compile_backend, str) \
            else getattr(self.compile_backend, "__name__", repr(self.compile_backend))
        self.compile_info.update(compiled=True, mode=cc.COMPILE_MODE, backend=backend,
                                 deterministic=self._deterministic(), cache=str(d), warm_cache=warm,
                                 compiled_at_batch=len(self.batches))
        self._compile_pending = {"key": key, "dir": d, "shape": tuple(host.shape)}
        log.info("compiling the VAE encoder (%s, %s cache %s)", cc.COMPILE_MODE, "warm" if warm else "cold", d)

    def _compiled_first_batch(self, dt: float) -> None:
        from shardsmith.encode import compile as cc

        pend, self._compile_pending = self._compile_pending, None
        eager = self._eager_s.get(pend["shape"], 0.0)  # (measured by auto; 0 for on: the batch's own time counts)
        self.compile_info["compile_s"] = round(max(0.0, dt - eager), 2)
        cc.mark_warm(pend["key"], {"compile_s": self.compile_info["compile_s"], "at": time.time()}, pend["dir"])
