"""diffusers' model classes imported without transformers, in a command that loads no transformers model or only
a text encoder (whose transformers core is then imported without scipy, torchao and peft).

diffusers' core imports transformers whenever it is installed: its pipeline quantisation config and its
loaders name transformers' classes, and transformers brings its own core, scipy and soundfile. Its
single-file loader imports its schedulers, which import ``scipy.stats``. A build whose
models are diffusers VAEs (an image or video VAE, LTX-2's audio VAE) uses none of it, and the import sits on
its critical path: the command waits for the model before its first batch (BENCHMARKS.md §10).

Contract
- :func:`allow`: called by a process that is a shardsmith command (the CLI, the GPU workers it starts). A
  library caller's process is left as it is: diffusers there sees transformers, as usual.
- :func:`model_class` ``(name, lean)``: the class ``diffusers.<name>``. Imported without transformers, torchao
  (whose only use here is a text encoder's quantisation), scipy (which diffusers' schedulers import, and
  its single-file loader imports them) and peft (which diffusers imports wherever it is installed, and which
  cannot be imported without transformers) when ``lean`` is true, :func:`allow` was called, and neither
  diffusers nor those packages are imported yet. For the length of that import
  ``sys.modules`` maps them to ``None``: an ``import`` of them raises ImportError and ``find_spec`` finds
  nothing, which diffusers takes as "not installed". Afterwards they import as usual again and diffusers'
  availability flags are read again, so a later import of a diffusers pipeline in the process sees them.
  Modules diffusers imported meanwhile keep what they decided (its PEFT backend stays off: the process loads
  no LoRA). Otherwise a plain import.
- diffusers' import maps every installed distribution's files to its top-level names
  (``importlib.metadata.packages_distributions``: 1.4 s of a build's critical path on the leased GPU image, which
  has hundreds of packages) for the few packages whose import name is not their distribution's. Within
  :func:`model_class`'s import in a command's process (lean or as usual; :func:`allow`) that map is
  :class:`LazyPackageMap`: made at its first lookup, which diffusers does only where such a package is
  installed; the same answers either way.
- :func:`transformers_core` ``(lean)``: transformers' model core (``transformers.modeling_utils``), imported
  before a text encoder is built; in a command (:func:`allow`) with ``lean`` (a text model that is neither
  quantised nor a teacher's) and where none of them is imported yet, without ``TEXT_KEPT_OUT`` (scipy, torchao,
  peft: transformers' object-detection losses, quantisers and adapters, none of which a text encoder's forward
  uses), so that a command whose VAE was imported lean and whose text encoder is transformers' pays for
  transformers' own modules only. Afterwards its availability checks are asked again (their caches cleared),
  as for diffusers; where that import fails (a package needing a kept-out one), the usual import.
- Another installed package that diffusers imports where present and that needs one of those (one not named
  here) fails the lean import: the kept-out packages are then in view again, their flags read again, and the
  class imported as usual. Python imports again only the modules whose import failed; those that completed
  keep what they decided, as above. An error of that plain import is the caller's.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import sys
import threading
from collections.abc import Mapping
from contextlib import contextmanager, nullcontext
from typing import Any, Callable, Iterator

KEPT_OUT = ("transformers", "torchao", "scipy", "peft")  # the packages a lean import keeps out
TEXT_KEPT_OUT = ("torchao", "scipy", "peft")  # what a command's lean import of transformers' core keeps out
_allowed = False
log = logging.getLogger(__name__)
_lock = threading.Lock()


def allow() -> None:
    """Let :func:`model_class` import diffusers without transformers in this process (a shardsmith command)."""
    global _allowed
    _allowed = True


@contextmanager
def _kept_out(names: tuple[str, ...]) -> Iterator[None]:
    """Within: ``import`` of ``names`` fails and ``find_spec`` finds none of them; after: as before."""
    before = {n: sys.modules[n] for n in names if n in sys.modules}
    for n in names:
        sys.modules[n] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        for n in names:
            if n in before:
                sys.modules[n] = before[n]
            elif sys.modules.get(n, False) is None:
                del sys.modules[n]


class LazyPackageMap(Mapping):
    """``importlib.metadata.packages_distributions()``, made at the first lookup, not when it is asked for."""

    def __init__(self) -> None:
        self._map: Mapping[str, list[str]] | None = None

    def _made(self) -> Mapping[str, list[str]]:
        if self._map is None:
            self._map = _packages_distributions()
        return self._map

    def __getitem__(self, key: str) -> list[str]:
        return self._made()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._made())

    def __len__(self) -> int:
        return len(self._made())


_packages_distributions = importlib.metadata.packages_distributions


@contextmanager
def _lazy_package_map() -> Iterator[None]:
    """Within: ``importlib.metadata.packages_distributions()`` returns a :class:`LazyPackageMap`."""
    importlib.metadata.packages_distributions = LazyPackageMap  # type: ignore[assignment]
    try:
        yield
    finally:
        importlib.metadata.packages_distributions = _packages_distributions


def _reread_flags() -> None:
    """diffusers' availability flags of the kept-out packages, read again now that they import."""
    from diffusers.utils import import_utils as iu

    probe = getattr(iu, "_is_package_available", None)  # (diffusers' own reader of them, pinned version)
    for n in KEPT_OUT:
        if probe is not None and hasattr(iu, f"_{n}_available"):
            available, version = probe(n)
            setattr(iu, f"_{n}_available", available)
            setattr(iu, f"_{n}_version", version)


def _lean(module: str, kept: tuple[str, ...], load: Callable[[], Any], reread: Callable[[], None]) -> Any:
    """``load()`` with ``kept`` out of view, in a command (:func:`allow`) where neither ``module`` nor ``kept`` is
    imported yet, then ``reread()`` (the library's flags of them, asked again); None where that did not apply or
    failed (a package needing a kept-out one: the caller imports as usual)."""
    if not _allowed or any(n in sys.modules for n in (module,) + kept):
        return None
    result = None
    try:
        with _kept_out(kept):
            result = load()
    except Exception as exc:  # noqa: BLE001 - a package needing a kept-out one: the caller's usual import
        log.debug("%s without %s failed (%s); importing it as usual", module, ", ".join(kept), exc)
    reread()
    return result


def model_class(name: str, lean: bool = False) -> Any:
    """``diffusers.<name>``, imported without transformers where the contract allows it."""
    def load() -> Any:
        with _lazy_package_map():
            import diffusers

            return getattr(diffusers, name)

    with _lock:
        cls = _lean("diffusers", KEPT_OUT, load, _reread_flags) if lean else None
        if cls is not None:
            return cls
        lazy = _allowed and "diffusers" not in sys.modules  # a command's usual import: the map made where looked up
        with _lazy_package_map() if lazy else nullcontext():
            import diffusers

            return getattr(diffusers, name)


def _reread_transformers_flags() -> None:
    """transformers' availability checks asked again (their caches cleared) now that the kept-out packages import."""
    iu = sys.modules.get("transformers.utils.import_utils")
    for name in dir(iu) if iu is not None else ():
        check = getattr(iu, name)
        if name.startswith("is_") and name.endswith("_available") and hasattr(check, "cache_clear"):
            check.cache_clear()


def transformers_core(lean: bool = False) -> None:
    """``transformers.modeling_utils`` imported, without ``TEXT_KEPT_OUT`` where the contract allows it."""
    core = "transformers.modeling_utils"
    with _lock:
        if lean:
            _lean(core, TEXT_KEPT_OUT, lambda: importlib.import_module(core), _reread_transformers_flags)
        importlib.import_module(core)  # (a plain import where the lean one did not run or failed)
