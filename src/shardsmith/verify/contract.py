"""The observed batch contract: what every key of the batches really held.

``ContractRecorder.add(batch)`` folds one batch (a dict of tensors, arrays, lists of str,
ints) into per-key statistics; ``merge`` combines recorders from several processes;
``to_dict`` gives a JSON-able contract::

    {key: {"type": "tensor", "shape": [3, 32, 32], "shapes": {...}, "dtype": "float32",
           "min": -1.0, "max": 1.0, "mean": 0.01, "nan": 0, "inf": 0, "samples": 120,
           "examples": [...]}}

For strings it records empty counts and example values; for integer labels their range.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

MAX_EXAMPLES = 3


try:
    import torch
except ImportError:  # pragma: no cover - torch is a dependency
    torch = None


def _is_array(v: Any) -> bool:
    return isinstance(v, np.ndarray) or (torch is not None and isinstance(v, torch.Tensor))


def _as_numpy(v: Any) -> np.ndarray | None:
    """A numpy view of ``v`` (bf16 as float32), or None when it is not an array (kept for callers;
    the recorder itself works on tensors directly)."""
    if torch is not None and isinstance(v, torch.Tensor):
        t = v.detach()
        if t.dtype == torch.bfloat16:
            t = t.float()
        return t.cpu().numpy()
    if isinstance(v, np.ndarray):
        return v
    return None


def _tensor_stats(t) -> tuple[int, int, float | None, float | None, float, int]:
    """``(nan, inf, min, max, sum, n_finite)`` of a real tensor, computed by torch on the
    tensor itself (no float32/float64/numpy copy of the whole batch).

    Fast path (every value finite, the common case): one ``aminmax`` pass (NaN and ±Inf show
    up in it) and one sum, accumulated in float32 (float64 for float64 and integers; bf16 and
    fp16 sums come back rounded to their own precision, about 3 significant digits).
    """
    t = t.detach()
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    n = t.numel()
    if not n:
        return 0, 0, None, None, 0.0, 0
    lo, hi = (float(x) for x in torch.aminmax(t))
    if not t.is_floating_point():
        return 0, 0, lo, hi, float(t.sum(dtype=torch.int64)), n
    if math.isfinite(lo) and math.isfinite(hi):
        if t.dtype == torch.float64:
            total = t.sum()
        elif t.dtype == torch.float32:
            total = t.sum(dtype=torch.float32)
        else:
            total = t.sum()  # bf16/fp16: float accumulation inside, a 16-bit result (a float32 copy costs 5x)
        return 0, 0, lo, hi, float(total), n
    nan = int(torch.isnan(t).sum())
    inf = int(torch.isinf(t).sum())
    t = t[torch.isfinite(t)]
    n = t.numel()
    if not n:
        return nan, inf, None, None, 0.0, 0
    lo, hi = torch.aminmax(t)
    return nan, inf, float(lo), float(hi), float(t.sum(dtype=torch.float64)), n


def _dtype_name(v: Any) -> str:
    return str(getattr(v, "dtype", type(v).__name__)).replace("torch.", "")


class KeyStats:
    def __init__(self) -> None:
        self.type: str | None = None
        self.dtype: str | None = None
        self.shapes: dict[str, int] = {}
        self.samples = 0
        self.min = math.inf
        self.max = -math.inf
        self.sum = 0.0
        self.count = 0
        self.nan = 0
        self.inf = 0
        self.empty = 0
        self.examples: list[Any] = []

    def _example(self, v: Any) -> None:
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(v)

    def add(self, value: Any, batch_size: int, constant: bool = False) -> None:
        """Fold one batch value: a stacked tensor ``[B, ...]``, a list (one entry per sample) or a scalar.
        ``constant``: a loader constant repeated over the batch (``files_map``): values are read
        from its first row only (every row is the same tensor), shapes and counts from all."""
        if isinstance(value, (list, tuple)):
            for v in value:
                if _is_array(v):
                    self._add_array(v, batched=False)
                else:
                    self.add_one(v)
            return
        if _is_array(value):
            self._add_array(value, batched=value.ndim >= 1 and value.shape[0] == batch_size, constant=constant)
            return
        self.add_one(value)

    def _add_array(self, value: Any, batched: bool, constant: bool = False) -> None:
        self.type = "tensor"
        self.dtype = _dtype_name(value)
        shape = list(value.shape[1:]) if batched else list(value.shape)
        key = "x".join(map(str, shape)) or "scalar"
        n = value.shape[0] if batched else 1
        self.shapes[key] = self.shapes.get(key, 0) + n
        self.samples += n
        if constant and batched and n > 1:
            value = value[:1]
        if isinstance(value, np.ndarray):
            self._add_numpy(value)
        elif value.numel() and not value.is_complex():
            try:
                nan, inf, lo, hi, total, count = _tensor_stats(value)
            except (RuntimeError, TypeError, NotImplementedError):  # a dtype/layout torch cannot reduce
                arr = _as_numpy(value)
                if arr is not None:
                    self._add_numpy(arr)
                return
            self.nan += nan
            self.inf += inf
            if count:
                self.min, self.max = min(self.min, lo), max(self.max, hi)
                self.sum += total
                self.count += count
            if value.ndim <= 1:
                for x in value.detach().reshape(-1)[:MAX_EXAMPLES].tolist():
                    self._example(x)

    def _add_numpy(self, arr: np.ndarray) -> None:
        if arr.size and arr.dtype.kind in "fiub":
            a = arr.astype(np.float64, copy=False)
            finite = np.isfinite(a)
            self.nan += int(np.isnan(a).sum())
            self.inf += int(np.isinf(a).sum())
            if finite.any():
                f = a[finite]
                self.min, self.max = min(self.min, float(f.min())), max(self.max, float(f.max()))
                self.sum += float(f.sum())
                self.count += int(f.size)
            if arr.ndim <= 1:
                for x in arr.reshape(-1)[:MAX_EXAMPLES]:
                    self._example(x.item())

    def add_one(self, v: Any) -> None:
        self.samples += 1
        if isinstance(v, str):
            self.type = "str"
            self.dtype = "str"
            if not v.strip():
                self.empty += 1
            self.min, self.max = min(self.min, len(v)), max(self.max, len(v))
            self._example(v[:80])
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            self.type = self.type or type(v).__name__
            self.dtype = type(v).__name__
            self.min, self.max = min(self.min, v), max(self.max, v)
            self.sum += v
            self.count += 1
            self._example(v)
        else:
            self.type = type(v).__name__
            self.dtype = self.type
            self._example(repr(v)[:80])

    def merge(self, o: "KeyStats") -> None:
        self.type = self.type or o.type
        self.dtype = self.dtype or o.dtype
        for k, n in o.shapes.items():
            self.shapes[k] = self.shapes.get(k, 0) + n
        self.samples += o.samples
        self.min, self.max = min(self.min, o.min), max(self.max, o.max)
        self.sum += o.sum
        self.count += o.count
        self.nan += o.nan
        self.inf += o.inf
        self.empty += o.empty
        for e in o.examples:
            self._example(e)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"type": self.type, "dtype": self.dtype, "samples": self.samples}
        if self.shapes:
            d["shape"] = [int(x) for x in max(self.shapes, key=self.shapes.get).split("x")] \
                if max(self.shapes, key=self.shapes.get) != "scalar" else []
            d["shapes"] = dict(self.shapes)
        lo, hi = (None if self.min == math.inf else self.min), (None if self.max == -math.inf else self.max)
        if self.type == "str":
            d.update(empty=self.empty, min_len=lo, max_len=hi)
        elif self.count:
            d.update(min=lo, max=hi, mean=self.sum / self.count)
        if self.type == "tensor":
            d.update(nan=self.nan, inf=self.inf)
        d["examples"] = self.examples
        return d


def batch_signature(batch: dict[str, Any]) -> dict[str, tuple]:
    """What a training step depends on, per batch key (``__`` keys left out): arrays as
    ``("tensor"|"ndarray", dtype, shape)``, lists as ``("list", len)``, anything else by type."""
    sig: dict[str, tuple] = {}
    for k, v in batch.items():
        if k.startswith("__"):
            continue
        if _is_array(v):
            sig[k] = (type(v).__name__, _dtype_name(v), tuple(int(x) for x in v.shape))
        elif isinstance(v, (list, tuple)):
            sig[k] = ("list", len(v))
        else:
            sig[k] = (type(v).__name__,)
    return sig


class ContractRecorder:
    """Fold batches into per-key stats; also counts batches and samples."""

    def __init__(self) -> None:
        self.keys: dict[str, KeyStats] = {}
        self.batches = 0
        self.samples = 0
        self.batch_sizes: dict[int, int] = {}

    @staticmethod
    def batch_size(batch: dict[str, Any]) -> int:
        for k in ("__key__", "fname"):
            if k in batch:
                return len(batch[k])
        for v in batch.values():
            if _is_array(v) and v.ndim:
                return int(v.shape[0])
            if isinstance(v, (list, tuple)):
                return len(v)
        return 1

    def add(self, batch: dict[str, Any], constant_keys=()) -> None:
        """Fold one batch; keys in ``constant_keys`` are loader constants (see ``KeyStats.add``)."""
        b = self.batch_size(batch)
        self.batches += 1
        self.samples += b
        self.batch_sizes[b] = self.batch_sizes.get(b, 0) + 1
        for k, v in batch.items():
            if k.startswith("__"):
                continue
            self.keys.setdefault(k, KeyStats()).add(v, b, constant=k in constant_keys)

    def merge(self, other: "ContractRecorder") -> None:
        self.batches += other.batches
        self.samples += other.samples
        for b, n in other.batch_sizes.items():
            self.batch_sizes[b] = self.batch_sizes.get(b, 0) + n
        for k, st in other.keys.items():
            self.keys.setdefault(k, KeyStats()).merge(st)

    def to_dict(self) -> dict[str, Any]:
        return {"batches": self.batches, "samples": self.samples,
                "batch_sizes": {str(k): v for k, v in sorted(self.batch_sizes.items())},
                "keys": {k: st.to_dict() for k, st in sorted(self.keys.items())}}
