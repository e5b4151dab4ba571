"""Inductor's coordinate-descent tuning results, kept across processes where this torch loses them.

``max-autotune`` tunes each Triton kernel's block sizes at its first run (coordinate descent) and keeps the winner
in Inductor's autotune cache beside the kernel. A kernel loaded from Inductor's caches (an Inductor artifact, a warm
``torch.compile``) reads that winner back in ``CachingAutotuner.recheck_autotune_cache``. Before the fix of
pytorch/pytorch#172819 (PR #173391), that method skipped kernels with one compiled config and dropped the winner's
``found_by_coordesc`` mark, so every process tuned every kernel again at its first batch: 9-12 s of a fresh process on
an H100, before any batch of a warm compiled build (BENCHMARKS.md §10, twenty-seventh session).

:func:`keep` wraps the method with the fix's two changes where the installed torch has the bug, and leaves a fixed
torch as it is. The kernels and their numerics are the tuned ones either way; only the re-tuning is skipped.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

BUGGY = "len(cached_configs) == 1 and len(configs) > 1"  # (the condition the fix removed)


def has_bug(method: Callable, torch_version: str | None = None) -> bool:
    """Whether ``method`` (a ``recheck_autotune_cache``) is the one before the fix: its source holds the condition
    the fix removed and does not carry the mark over. Where its source cannot be read (an install without it), by
    ``torch_version`` (default: the installed one): the fix is in torch 2.12 (2.11.0 has the bug, 2.12.1 not)."""
    try:
        source = inspect.getsource(method)
    except (OSError, TypeError):
        import torch

        major, minor = (int(v) for v in (torch_version or torch.__version__).split(".")[:2])
        return (major, minor) < (2, 12)
    return BUGGY in source and "compile_result.config.found_by_coordesc" not in source


def keep() -> bool:
    """Make this process reuse coordinate-descent winners from Inductor's autotune cache (see the module); returns
    whether the installed method needed it. Idempotent; a torch without the method is left alone."""
    try:
        from torch._inductor.runtime import triton_heuristics as th
    except ImportError:
        return False
    cls = getattr(th, "CachingAutotuner", None)
    original = getattr(cls, "recheck_autotune_cache", None)
    if original is None:
        return False
    if getattr(original, "_shardsmith_keeps_coordesc", False):
        return True
    if not has_bug(original):
        return False

    def recheck_autotune_cache(self, reload_kernel_from_src: Callable[[], Any]) -> None:
        configs = [result.config for result in self.compile_results]
        cached, _, _ = th.check_autotune_cache(configs, self.filename, self.inductor_meta)
        original(self, reload_kernel_from_src)
        carry_winner(self, cached, len(configs), reload_kernel_from_src, th.triton_config_to_hashable)

    recheck_autotune_cache._shardsmith_keeps_coordesc = True  # type: ignore[attr-defined]
    recheck_autotune_cache.__doc__ = original.__doc__
    cls.recheck_autotune_cache = recheck_autotune_cache
    return True


def carry_winner(tuner: Any, cached: list, n_configs: int, reload_kernel_from_src: Callable[[], Any],
                 hashable: Callable[[Any], Any]) -> None:
    """After the original recheck: where the cache's winner (``cached``, read from the ``n_configs`` configs the
    kernel had) was found by coordinate descent, mark the compile result that is it, narrowing to it; where the
    kernel had one config (which the original skipped) and the winner is not it, compile the winner."""
    if len(cached) != 1 or not getattr(cached[0], "found_by_coordesc", False):
        return
    best = hashable(cached[0])
    for result in tuner.compile_results:
        if hashable(result.config) == best:
            result.config.found_by_coordesc = True
            tuner.compile_results = [result]
            return
    if n_configs == 1:  # (with several, the original compiled the winner already where it was not among them)
        if tuner.fn.fn is None:
            tuner.fn = reload_kernel_from_src().fn
        tuner.compile_results = [tuner._precompile_config(cached[0])]
