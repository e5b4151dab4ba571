"""Inductor's coordinate-descent tuning results, kept across processes where this torch loses them.

``max-autotune`` tunes each pointwise Triton kernel's block sizes at its first run (coordinate descent) and keeps the
winner in Inductor's autotune cache beside the kernel (a ``.best_config`` file marked ``found_by_coordesc``). A later
process should read the winner back and skip the tuning, but the leased torch 2.11 loses it on two paths and could on
a third, so every process tuned every kernel again at its first batch: 9-15 s before any batch of a warm compiled
build on an H100 (BENCHMARKS.md §10, twenty-seventh and twenty-eighth sessions):

- ``CachingAutotuner.recheck_autotune_cache`` (kernels loaded from Inductor's caches) skipped kernels with one
  compiled config and dropped the winner's mark (pytorch/pytorch#172819, fixed in 2.12 by PR #173391); and an
  artifact's kernels are copies narrowed at compile time to one config, whose hash never finds the winner;
- a kernel compiled in Inductor's worker pool comes back pickled, and Triton's ``Config.__setstate__`` keeps only
  its own fields, so the mark is gone;
- loading an Inductor artifact writes the autotune entries saved in it over the cache's; an entry saved before
  the tuning (its heuristic pick, unmarked) would replace the winner that a tuning kept (a guard: the artifact's
  own entries are recorded in the order saved, so its winner should come last).

:func:`keep` mends all three in this process: the first where the installed method has the bug; the second at the one
place tuning starts (``_coordinate_descent_tuning``), which first asks the kernel's own autotune cache for a winner
for the same set of configs and uses it; the third where an artifact's entry would replace a winner of the same
kernel and configs with an unmarked one. The kernels are the ones the tuning chose, with their numerics; only the
re-tuning is skipped. :func:`counts` says what this process reused and tuned (the manifest's ``coordesc_cache``).
"""

from __future__ import annotations

import inspect
import json
import os
from typing import Any, Callable

BUGGY = "len(cached_configs) == 1 and len(configs) > 1"  # (the condition the fix removed)
_MARK = "_shardsmith_keeps_coordesc"  # (on each method wrapped here: wrapped once per process)

_counts = {"winners_reused": 0, "kernels_tuned": 0, "stale_entries_kept_out": 0}


def counts(since: dict[str, Any] | None = None) -> dict[str, Any]:
    """What this process did since it started, or since ``since`` (an earlier :func:`counts`, e.g. at a build's
    start): kernels whose cached winner was reused where tuning would have started, kernels tuned (no winner
    cached), artifact entries kept from replacing a winner; and which of the three mends :func:`keep` installed."""
    base = since or {}
    return {**{k: v - base.get(k, 0) for k, v in _counts.items()}, "mended": sorted(_mended)}


_mended: set[str] = set()


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
    whether any mend was installed. Idempotent; a torch without these parts of Inductor is left alone."""
    try:
        from torch._inductor.runtime import autotune_cache as ac
        from torch._inductor.runtime import triton_heuristics as th
    except ImportError:
        return False
    cls = getattr(th, "CachingAutotuner", None)
    if cls is None:
        return False
    _keep_recheck(cls, th)
    _keep_tuning(cls, getattr(ac, "_load_cached_autotuning", None), th)
    _keep_on_load(getattr(ac, "AutotuneCacheArtifact", None), ac)
    return bool(_mended)


def _wrapped(owner: Any, name: str) -> Any:
    """``owner.name`` where it exists and is not wrapped here yet, else None."""
    method = getattr(owner, name, None) if owner is not None else None
    return None if method is None or getattr(method, _MARK, False) else method


def _install(owner: Any, name: str, original: Callable, wrapper: Callable) -> None:
    setattr(wrapper, _MARK, True)
    wrapper.__doc__, wrapper.__wrapped__ = original.__doc__, original  # type: ignore[attr-defined]
    setattr(owner, name, wrapper)
    _mended.add(name)


def _keep_recheck(cls: Any, th: Any) -> None:
    """pytorch#172819: the fix's two changes around the original, where the installed method has the bug."""
    original = _wrapped(cls, "recheck_autotune_cache")
    if original is None or not has_bug(original):
        return

    def recheck_autotune_cache(self, reload_kernel_from_src: Callable[[], Any]) -> None:
        configs = [result.config for result in self.compile_results]
        cached, _, _ = th.check_autotune_cache(configs, self.filename, self.inductor_meta)
        original(self, reload_kernel_from_src)
        carry_winner(self, cached, len(configs), reload_kernel_from_src, th.triton_config_to_hashable)

    _install(cls, "recheck_autotune_cache", original, recheck_autotune_cache)


def _keep_tuning(cls: Any, load: Callable | None, th: Any) -> None:
    """Where tuning would start, the kernel's cached winner first (:func:`cached_winner`, :func:`winner_launcher`)."""
    original = _wrapped(cls, "_coordinate_descent_tuning")
    if original is None or load is None:
        return

    def _coordinate_descent_tuning(self, launcher, *args, **kwargs):
        winner = cached_winner(self, load)
        if winner is None:
            _counts["kernels_tuned"] += 1
            return original(self, launcher, *args, **kwargs)
        _counts["winners_reused"] += 1
        return winner_launcher(self, launcher, winner, th.triton_config_to_hashable)

    _install(cls, "_coordinate_descent_tuning", original, _coordinate_descent_tuning)


def cached_winner(tuner: Any, load: Callable) -> Any | None:
    """The coordinate-descent winner that ``tuner``'s own autotune cache (the one its save hook writes to) holds for
    its kernel and set of configs, as a config marked ``found_by_coordesc`` (``load``: Inductor's
    ``_load_cached_autotuning``); None where it holds none, an unmarked pick, or one for other configs."""
    cache = getattr(getattr(tuner, "save_cache_hook", None), "__self__", None)
    read = getattr(cache, "_read", None)
    if read is None or not tuner.inductor_meta.get("coordinate_descent_tuning"):
        return None
    try:
        entry = read()
        if not isinstance(entry, dict) or not entry.get("found_by_coordesc"):
            return None
        winner = load(dict(entry), cache.configs_hash, [], tuner.inductor_meta)
    except Exception:  # noqa: BLE001 - a shortcut only: whatever fails reading the cache, the kernel is tuned
        return None
    return winner if getattr(winner, "found_by_coordesc", False) else None


def winner_launcher(tuner: Any, launcher: Any, winner: Any, hashable: Callable[[Any], Any]) -> Any:
    """The launcher of ``winner``: ``launcher`` itself, marked, where it runs that config, else the winner compiled
    (the kernel's source loaded first where a worker compiled it, as the tuning itself does)."""
    if hashable(launcher.config) == hashable(winner):
        launcher.config.found_by_coordesc = True
        return launcher
    if hasattr(tuner, "_ensure_kernel_loaded"):
        tuner._ensure_kernel_loaded()
    elif tuner.fn.fn is None:
        tuner.fn = tuner._reload_kernel().fn
    with tuner.lock:
        return tuner._precompile_config(winner).make_launcher()


def _keep_on_load(artifact_cls: Any, ac: Any) -> None:
    """An artifact's autotune entry does not replace a winner with an unmarked entry (:func:`stale`)."""
    original = _wrapped(artifact_cls, "populate_cache")
    if original is None:
        return

    def populate_cache(self) -> None:
        if stale(os.path.join(ac.cache_dir(), self.key), self.content):
            _counts["stale_entries_kept_out"] += 1
            return
        original(self)

    _install(artifact_cls, "populate_cache", original, populate_cache)


def stale(path: str, content: bytes) -> bool:
    """Whether the autotune entry ``content`` (JSON bytes, as Inductor keeps them) would replace, at ``path``, a
    coordinate-descent winner for the same configs with an entry that is not one. Unreadable either side: False."""
    try:
        with open(path, "rb") as fh:
            kept = json.loads(fh.read())
        new = json.loads(content)
    except (OSError, ValueError, TypeError):
        return False
    return (isinstance(kept, dict) and isinstance(new, dict) and bool(kept.get("found_by_coordesc"))
            and not new.get("found_by_coordesc") and kept.get("configs_hash") == new.get("configs_hash"))


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
