"""Whether and when an encode stage compiles its VAE (``models.compile``: ``on``, ``off``, ``auto``).

Contract (a mixin of :class:`~shardsmith.encode.stage.EncodeStage`, which sets the attributes used)
- ``expect(items, since=)`` / ``remaining``: how many items the build still has to encode.
- ``_maybe_compile(host)``, called before every batch: ``on`` compiles before the first batch;
  ``off`` never; ``auto`` stays eager off the GPU and, on a GPU, decides once after
  :data:`~shardsmith.encode.compile.DECIDE_AFTER_BATCHES` full eager batches from the remaining
  items and the measured eager rate (:func:`~shardsmith.encode.compile.compile_pays`). The decision
  and its reason are kept in ``compile_info`` for the manifest.
- A compile with Inductor runs in its deterministic mode (``compile_info["deterministic"]``): every process
  compiles the same kernels, so a resumed or a second build's compiled batches are the same bytes.
- ``_compiled_first_batch(dt)`` books the first compiled batch's extra time and marks the
  compile cache warm for this model and shape.
"""

from __future__ import annotations

import logging
import time

import torch

from shardsmith.encode.model_identity import model_identity

log = logging.getLogger(__name__)


class CompileDecision:
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
        return sorted(b.encode_s for b in self.batches[1:] if b.rows == self.batch_size)

    def _compile_key(self, host: torch.Tensor, cc) -> str:
        dev = torch.cuda.get_device_name() if self.device == "cuda" else "cpu"
        det = ":deterministic" if self._deterministic() else ""
        return cc.cache_key(model_identity(self.describe()["vae"]), tuple(host.shape[1:]), self.vae.spec.dtype,
                            torch.__version__, dev, f"{self.compile_backend}:{cc.COMPILE_MODE}{det}")

    def _deterministic(self) -> bool:
        """Whether this compile runs in Inductor's deterministic mode (the same bytes in every process)."""
        from shardsmith.encode import compile as cc

        return self.compile_backend == "inductor" and bool(cc.inductor_options().get("deterministic"))

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
        self.compile_info.update(compiled=True, mode=cc.COMPILE_MODE, backend=backend,
                                 deterministic=self._deterministic(), cache=str(d), warm_cache=warm,
                                 compiled_at_batch=len(self.batches))
        self._compile_pending = {"key": key, "dir": d}
        log.info("compiling the VAE encoder (%s, %s cache %s)", cc.COMPILE_MODE, "warm" if warm else "cold", d)

    def _compiled_first_batch(self, dt: float) -> None:
        from shardsmith.encode import compile as cc

        pend, self._compile_pending = self._compile_pending, None
        eager = self._full_batch_times() or [0.0]
        self.compile_info["compile_s"] = round(max(0.0, dt - eager[len(eager) // 2]), 2)
        cc.mark_warm(pend["key"], {"compile_s": self.compile_info["compile_s"], "at": time.time()}, pend["dir"])
