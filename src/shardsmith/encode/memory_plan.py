"""GPU memory and time before a run: each model's peak at the build's batch, whether it fits, how large a
batch would fit, and the encoder's rate.

Contract
- :class:`ModelMemory`: one model's figures. ``param_bytes`` (its weights and buffers, exact),
  ``peak_bytes`` (the device's peak allocation while it ran one batch of ``batch`` items, measured with
  ``torch.cuda.max_memory_allocated``), ``per_item_bytes`` = (peak - params) / batch, and ``seconds``:
  one timed batch after the first (autotuning) one, when measured.
- :func:`largest_batch(m, free)`: the largest power of two (at most 1024) whose estimated peak,
  params + batch x per item, is at most :data:`HEADROOM` of ``free`` bytes; 0 when the weights alone do not.
- :func:`summary(models, free, total, items)`: what ``scan --recipe --probe-models`` and the start of a GPU
  build print: per model, the peak at its batch and the share of the GPU, fits or not, the largest batch
  that fits, and the expected encode time for ``items`` from the measured rate.
- :func:`param_bytes(module)`: bytes of a module's parameters and buffers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

HEADROOM = 0.9  # of the free memory a batch may take: the allocator's fragmentation and other processes


@dataclass(frozen=True)
class ModelMemory:
    name: str  # vae / text / audio_vae
    what: str  # family, weights, and the shape it was measured at
    batch: int
    param_bytes: int
    peak_bytes: int | None  # None: not measured (off a GPU)
    seconds: float | None = None  # one batch, after the first

    @property
    def per_item_bytes(self) -> int | None:
        if self.peak_bytes is None or self.batch <= 0:
            return None
        return max(0, self.peak_bytes - self.param_bytes) // self.batch

    @property
    def items_per_s(self) -> float | None:
        return self.batch / self.seconds if self.seconds else None

    def to_dict(self) -> dict:
        return {**asdict(self), "per_item_bytes": self.per_item_bytes, "items_per_s": self.items_per_s}


def _tensor_bytes(t) -> int:
    """A tensor's bytes; a wrapper subclass (torchao's quantised weights) counts the tensors it holds."""
    flatten = getattr(type(t), "__tensor_flatten__", None)
    if flatten is not None:
        names, _ = t.__tensor_flatten__()
        return sum(_tensor_bytes(getattr(t, n)) for n in names)
    return t.numel() * t.element_size()


def param_bytes(module) -> int:
    """Bytes of ``module``'s parameters and buffers (as loaded: after casting or quantising); tied
    weights once."""
    seen, total = set(), 0
    for t in list(module.parameters()) + list(module.buffers()):
        if id(t) in seen:
            continue
        seen.add(id(t))
        total += _tensor_bytes(t)
    return total


def largest_batch(m: ModelMemory, free: int, cap: int = 1024) -> int:
    per = m.per_item_bytes
    if per is None:
        return 0
    best, b = 0, 1
    while b <= cap:
        if m.param_bytes + b * per <= HEADROOM * free:
            best = b
        b *= 2
    return best


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2 ** 30:.2f} GiB"


def summary(models: list[ModelMemory], free: int | None, total: int | None, items: int | None = None) -> list[str]:
    """Lines for a person (see the module)."""
    lines = []
    for m in models:
        if m.peak_bytes is None:
            lines.append(f"{m.name} {m.what}: weights {_gib(m.param_bytes)}; GPU memory is measured on a GPU only "
                         f"(this ran on the CPU){_rate(m, items)}")
            continue
        share = f" = {100 * m.peak_bytes / total:.1f} % of the GPU's {_gib(total)}" if total else ""
        fits = "" if free is None else ("; fits" if m.peak_bytes <= free else
                                        f"; does NOT fit the {_gib(free)} free: lower models.batch_size")
        line = (f"{m.name} {m.what}: peak {_gib(m.peak_bytes)} at batch {m.batch} (weights {_gib(m.param_bytes)}, "
                f"{_gib(m.per_item_bytes)} an item){share}{fits}")
        if free is not None:
            line += f"; the largest batch that fits: {largest_batch(m, free)}"
        lines.append(line + _rate(m, items))
    return lines


def _rate(m: ModelMemory, items: int | None) -> str:
    if not m.items_per_s:
        return ""
    return f"; {m.items_per_s:.1f} items/s at batch {m.batch}" + (
        f", ~{items / m.items_per_s:.0f} s for {items} items" if items else "")


def gpu_free_total(device_index: int | None = None) -> tuple[int | None, int | None]:
    """``(bytes this process may still use, the GPU's total)``: free memory plus what torch's allocator
    holds already; ``(None, None)`` without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None, None
    free, total = torch.cuda.mem_get_info(device_index)
    return free + torch.cuda.memory_reserved(device_index), total


def _together(models: list[ModelMemory], beside: tuple[str, ...] = ()) -> int | None:
    """Every model's weights, plus the largest batch's activations; a model named in ``beside`` runs on a stream of
    its own, whose memory the others' batches do not reuse: its largest activations add to theirs."""
    acts = [m.peak_bytes - m.param_bytes for m in models if m.peak_bytes is not None and m.name not in beside]
    added = {m.name: 0 for m in models if m.name in beside}
    for m in models:
        if m.name in beside and m.peak_bytes is not None:
            added[m.name] = max(added[m.name], m.peak_bytes - m.param_bytes)
    weights = sum({m.name: m.param_bytes for m in models}.values())
    if not acts and not any(added.values()):
        return None
    return weights + max(acts, default=0) + sum(added.values())


def text_fits_beside(models: list[ModelMemory], usable_bytes: int | None) -> bool:
    """Whether the text encoder may run on a stream of its own beside the VAE's batches: both were measured,
    and every model's weights with the others' largest activations and the text encoder's added (:func:`_together`
    with ``beside=("text",)``: the peak the manifest then predicts) take at most :data:`HEADROOM` of
    ``usable_bytes`` (the memory this process may use); False without a GPU."""
    names = {m.name for m in models if m.peak_bytes is not None}
    if usable_bytes is None or not {"text", "vae"} <= names:
        return False
    need = _together(models, beside=("text",))
    return need is not None and need <= HEADROOM * usable_bytes


def memory_block(models: list[ModelMemory], measured_peak: int | None, apart: tuple[str, ...] = (),
                 beside: tuple[str, ...] = ()) -> dict:
    """The manifest's ``models.memory``: each model's figures, the peak predicted for the run (every
    model's weights resident, plus the largest batch's activations; a model named in ``apart`` ran alone,
    before the others were loaded: the larger of its peak and theirs; one named in ``beside`` ran on its own
    stream: its activations add) and the peak measured over the run (the caller's: the stage gives the larger
    of the batches' peak and the peak a model apart measured)."""
    parts = [_together([m for m in models if m.name not in apart], beside=beside)]
    parts += [_together([m for m in models if m.name == name]) for name in apart]
    known = [p for p in parts if p is not None]
    return {"models": [m.to_dict() for m in models],
            "predicted_peak_bytes": max(known) if known else None,
            "measured_peak_bytes": measured_peak, **({"beside": list(beside)} if beside else {})}
