"""``models.offload``: whether the text encoder and the VAE share the GPU, or the text encoder runs first,
alone, and is freed before the VAE loads (``text-first``).

Contract
- :class:`OffloadDecision`: the settled mode (``off`` / ``text-first``), the recipe's setting, why, and the
  figures it was decided on; ``record()`` is what the ledger keeps (meta :data:`LEDGER_KEY`), ``to_dict()``
  the manifest's ``models.offload`` (with the text pass's counts once it ran).
- :func:`decide(setting, text, vae, free)`: the arithmetic of ``auto`` on
  :class:`~shardsmith.encode.memory_plan.ModelMemory` estimates and the bytes free: ``off`` when every weight
  plus the larger model's activations at the build's batch fit :data:`~shardsmith.encode.memory_plan.HEADROOM`
  of the free memory; else ``text-first``; an :class:`OffloadError` (exit 2) naming the models, the bytes and
  what to set when one does not fit even alone: the text encoder with one prompt, or the VAE's weights (its
  activation figure is a coarse guess, and it halves its batch and tiles when out of memory). No GPU
  (``free`` None) or no estimate: ``off``. ``off`` and ``text-first`` are taken as set.
- :func:`settle(recipe, ledger)` (the build, before its plan and its workers): the recipe the build runs,
  with ``models.offload`` settled where that needs no GPU query: a build with one of the two models (or on
  the CPU) is ``off``; ``text-first`` with ``distribute.gpus`` other than 1 is refused (exit 2), ``auto``
  there is ``off``; a resumed build keeps the decision the ledger holds for ``auto`` (an explicit setting is
  taken as set: the bytes are the same either way). What is settled is kept in the ledger; an ``auto`` left
  for the GPU is decided by the model loader (:class:`OffloadRun`) and kept when the models are first used.
- :class:`OffloadRun`: what the model loader needs for it: the build folder, its ledger, the decision kept,
  the plan running ahead (if any), the event that says the plan is done and the build's progress display.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from shardsmith.encode.memory_plan import HEADROOM, ModelMemory
from shardsmith.errors import UserError

LEDGER_KEY = "offload"
MODES = ("off", "text-first")


class OffloadError(UserError):
    """``models.offload`` cannot be honoured (the models do not fit, or not in this kind of build)."""


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2 ** 30:.2f} GiB"


@dataclass(frozen=True)
class OffloadDecision:
    mode: str  # off | text-first
    setting: str  # auto | off | text-first, as the recipe said
    reason: str
    free_bytes: int | None = None
    together_bytes: int | None = None  # both models resident, the larger activations at the build's batch
    text_bytes: int | None = None  # the text encoder alone, one prompt
    vae_bytes: int | None = None  # the VAE alone, one item
    text_pass: dict[str, Any] | None = field(default=None, compare=False)  # counts of the text pass (this run)

    def record(self) -> dict[str, Any]:
        """What the ledger keeps (no per-run counts)."""
        return {k: v for k, v in asdict(self).items() if k != "text_pass"}

    @classmethod
    def from_record(cls, d: dict[str, Any]) -> "OffloadDecision":
        return cls(**{k: d.get(k) for k in ("mode", "setting", "reason", "free_bytes", "together_bytes",
                                            "text_bytes", "vae_bytes")})

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    def line(self) -> str:
        """One line for a person."""
        kept = "" if self.setting == self.mode else f" (models.offload {self.setting})"
        return f"offload {self.mode}{kept}: {self.reason}"


def decide(setting: str, text: ModelMemory | None, vae: ModelMemory | None, free: int | None) -> OffloadDecision:
    """See the module contract."""
    if setting in MODES:
        return OffloadDecision(setting, setting, "set in the recipe")
    if free is None:
        return OffloadDecision("off", setting, "no GPU: the models run on the CPU, whose memory is not planned here")
    if text is None or vae is None or text.peak_bytes is None or vae.peak_bytes is None:
        missing = ", ".join(n for n, m in (("text", text), ("vae", vae)) if m is None or m.peak_bytes is None)
        return OffloadDecision("off", setting, f"no memory estimate for models.{missing} (set models.offload: "
                               "text-first if the two do not fit together)", free)
    usable = HEADROOM * free
    acts = max(text.peak_bytes - text.param_bytes, vae.peak_bytes - vae.param_bytes)
    together = text.param_bytes + vae.param_bytes + acts
    alone_text = text.param_bytes + (text.per_item_bytes or 0)
    alone_vae = vae.param_bytes + (vae.per_item_bytes or 0)
    figures = dict(free_bytes=free, together_bytes=together, text_bytes=alone_text, vae_bytes=alone_vae)
    if together <= usable:
        return OffloadDecision("off", setting, f"both fit: {_gib(together)} of {_gib(free)} free", **figures)
    # refused on what is sure: the text encoder with one prompt (its activations are calibrated), the VAE's
    # weights (its activation figure is a guess, and it halves its batch and tiles when out of memory)
    big = [(n, m, b) for n, m, b in (("text", text, alone_text), ("vae", vae, vae.param_bytes)) if b > usable]
    if big:
        names = " and ".join(f"models.{n} ({m.what}: {_gib(b)}{' with one prompt' if n == 'text' else ''}, "
                             f"weights {_gib(m.param_bytes)})" for n, m, b in big)
        raise OffloadError(
            f"models.offload auto: {names} does not fit the GPU's {_gib(free)} free ({HEADROOM:.0%} usable) even "
            "alone; set models.text.quantize: int8, models.text.dtype / models.vae.dtype: bfloat16, a smaller "
            "models.text.max_length or geometry.buckets, free the GPU of other work, or models.device: cpu")
    tight = "" if alone_vae <= usable else "; the VAE may need its out-of-memory fallback (halved batch, tiling)"
    return OffloadDecision("text-first", setting, f"together {_gib(together)} > {HEADROOM:.0%} of {_gib(free)} free; "
                           f"alone: text {_gib(alone_text)}, vae {_gib(alone_vae)}{tight}", **figures)


def needs_both(recipe) -> bool:
    """The build loads a text encoder and a VAE (the only case where offloading changes anything)."""
    from shardsmith.recipe import LATENT_OUTPUTS

    m = recipe.models
    return m.text is not None and m.vae is not None and any(isinstance(o, LATENT_OUTPUTS) for o in recipe.outputs)


def free_bytes(device: str) -> int | None:
    """Bytes of GPU memory this process may use on ``device`` (resolved); None off a GPU. Tests patch it."""
    if not device.startswith("cuda"):
        return None
    from shardsmith.encode.memory_plan import gpu_free_total

    index = int(device.split(":", 1)[1]) if ":" in device else None
    return gpu_free_total(index)[0]


def settle(recipe, ledger):
    """See the module contract; returns the recipe with ``models.offload`` settled, or still ``auto`` when
    the GPU must be asked (by the model loader, after the build's workers are started)."""
    from shardsmith.precheck import resolve_device

    setting = recipe.models.offload
    kept = ledger.get_meta(LEDGER_KEY)
    gpus = recipe.distribute.gpus
    decision = None
    if not needs_both(recipe):
        decision = OffloadDecision("off", setting, "the build loads one of the text encoder and the VAE only")
    elif gpus != 1 and setting == "text-first":
        raise OffloadError(f"models.offload: text-first runs in one process, and distribute.gpus (--gpus) is {gpus}: "
                           "each worker loads its own models; set models.offload: off (or auto), or --gpus 1")
    elif gpus != 1:
        decision = OffloadDecision("off", setting, f"distribute.gpus {gpus}: every worker holds both models "
                                   "(text-first runs in one process only)")
    elif setting in MODES:
        decision = OffloadDecision(setting, setting, "set in the recipe")
    elif kept is not None:
        decision = OffloadDecision.from_record(kept)
        if decision.setting != setting:  # kept for an explicit setting, now auto: auto decides afresh
            decision = None
    if decision is None and setting == "auto":
        device = resolve_device(recipe.models.device, "models.device", quick=True)  # (no torch before the plan)
        if device == "cpu" and free_bytes(device) is None:
            decision = OffloadDecision("off", setting, "no GPU: the models run on the CPU")
    if decision is None:  # auto on a GPU: the model loader asks it (see OffloadRun)
        return recipe
    if kept is None or OffloadDecision.from_record(kept) != decision:
        ledger.set_meta(LEDGER_KEY, decision.record())
    if decision.mode == setting:
        return recipe
    out = recipe.model_copy(deep=True)
    out.models.offload = decision.mode
    return out


class Cancelled(RuntimeError):
    """The text pass stopped because the build failed (never a build's own error: it is not re-raised)."""


@dataclass
class OffloadRun:
    """What the model loader needs for ``models.offload`` in a build (see the module)."""

    root: Path  # the folder being built; the text cache lives in its .shardsmith/
    ledger_path: Path
    kept: dict[str, Any] | None = None  # the ledger's decision, when one is kept
    ahead: Any = None  # the PlanAhead running the plan in its own process, or None
    planned: threading.Event | None = None  # set once the plan is done (or the build no longer waits for it)

    decided: OffloadDecision | None = None  # set by decide_for, read by the model loader
    progress: Any = None  # the build's Progress: the text pass shows its count there
    cancelled: threading.Event = field(default_factory=threading.Event)  # the build failed: the text pass stops

    def check_cancelled(self) -> None:
        """Raise :class:`Cancelled` once the build has failed (the text pass calls it as it goes)."""
        if self.cancelled.is_set():
            raise Cancelled("the build failed; the text pass stopped")

    def decide_for(self, recipe) -> OffloadDecision:
        """:meth:`decision` on ``models.device`` at the encode stage's text batch; kept in ``decided``."""
        from shardsmith.precheck import resolve_device

        device = resolve_device(recipe.models.device, "models.device")
        self.decided = self.decision(recipe, device, text_batch(recipe, device))
        return self.decided

    def decision(self, recipe, device: str, batch: int) -> OffloadDecision:
        """The decision this build runs with: the one kept, the recipe's explicit one, or ``auto``'s arithmetic
        on the estimates (:mod:`~shardsmith.encode.memory_estimate`) and the free memory of ``device``."""
        setting = recipe.models.offload
        if setting in MODES:  # settled by settle() (kept in the ledger with its reason) or set in the recipe
            if self.kept is not None and self.kept.get("mode") == setting:
                return OffloadDecision.from_record(self.kept)
            return decide(setting, None, None, None)
        if not needs_both(recipe):
            return OffloadDecision("off", setting, "the build loads one of the text encoder and the VAE only")
        free = free_bytes(device)
        if free is None:
            return decide(setting, None, None, None)
        from shardsmith.encode.memory_estimate import estimate

        return decide(setting, estimate(recipe, "text", batch), estimate(recipe, "vae", batch), free)


def text_batch(recipe, device: str) -> int:
    """Prompts a text batch of the pass holds: the encode stage's batch size (``models.batch_size``, else its
    default for the VAE's kind on ``device``), so that on a GPU the pass's padded batches have the stage's shape."""
    from shardsmith.encode.stage import default_batch
    from shardsmith.encode.vae_config import FAMILIES

    vae = recipe.models.vae
    video = vae is not None and FAMILIES[vae.family]["kind"] == "video_vae"
    return recipe.models.batch_size or default_batch(video, "cuda" if device.startswith("cuda") else device)


def with_pass(decision: OffloadDecision, counts: dict[str, Any]) -> OffloadDecision:
    return replace(decision, text_pass=counts)
