"""When to ``torch.compile`` the VAE encoder, and where its compiled kernels are cached.

Contract
- :func:`inductor_options` are the Inductor settings of a compile: ``COMPILE_MODE``'s, in Inductor's
  deterministic mode (kernels chosen without timing them on the device), so every process compiles the same
  kernels and a resumed, a second or another GPU's build writes the same bytes; refused nowhere (a torch
  without that mode compiles as before, and the manifest says ``deterministic: false``).
- :func:`compile_pays` is pure arithmetic: given the items still to encode, the eager rate
  measured on this run's warm-up (a batch of the first shape) and whether the cache already holds this
  model/shape, it says whether compiling repays its cost, and why (a sentence for the manifest).
- :func:`cache_dir` is where Inductor keeps compiled graphs and autotuning results between runs
  (``$TORCHINDUCTOR_CACHE_DIR`` when set, else ``$XDG_CACHE_HOME/shardsmith/inductor``);
  :func:`cache_key` / :func:`is_warm` / :func:`mark_warm` remember which (model, input shape,
  dtype, torch, GPU) were compiled there, so a later run knows its compile will be cheap.

The speed-up and compile times these constants assume are measured in BENCHMARKS.md §5 and §10.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

COMPILE_MODE = "max-autotune-no-cudagraphs"
EXPECTED_SPEEDUP = 2.0  # a little under the measured speed-up (BENCHMARKS.md §5, §10), to stay on the safe side
COST_S = {"cold": 120.0, "warm": 20.0}  # compile seconds: empty cache / cache holding this graph (§10, deterministic)
_MARKER = "shardsmith-compiled.json"


def inductor_options(mode: str | None = COMPILE_MODE) -> dict[str, Any]:
    """The options of ``torch.compile(backend="inductor", options=...)``: ``mode``'s own (torch refuses a mode and
    options together), with ``deterministic`` where this torch's Inductor has it. (The mode must travel as
    options: Dynamo sets Inductor's global ``deterministic`` back to ``torch.are_deterministic_algorithms_enabled()``
    after every trace, while options hold for the compile they are given to, and are written into its kernels.)"""
    import torch._inductor
    import torch._inductor.config

    opts = dict(torch._inductor.list_mode_options(mode or "default"))
    if hasattr(torch._inductor.config, "deterministic"):
        opts["deterministic"] = True
    return opts


def compile_pays(remaining_items: int, eager_items_per_s: float, warm: bool,
                 speedup: float = EXPECTED_SPEEDUP) -> tuple[bool, str]:
    """``(compile?, why)``: compile when the time it saves on the remaining items exceeds its cost."""
    if remaining_items <= 0 or eager_items_per_s <= 0:
        return False, "nothing left to encode"
    eager_s = remaining_items / eager_items_per_s
    saved = eager_s * (1.0 - 1.0 / speedup)
    cost = COST_S["warm" if warm else "cold"]
    verdict = saved > cost
    why = (f"{remaining_items} items left at {eager_items_per_s:.1f}/s eager = {eager_s:.0f} s; compiling "
           f"(~{speedup:.1f}x) would save ~{saved:.0f} s for ~{cost:.0f} s of compile "
           f"({'warm' if warm else 'cold'} cache): {'compile' if verdict else 'stay eager'}")
    return verdict, why


def _torch_default_dir() -> str:
    """Where Inductor caches by default, a temporary folder: what ``torch._inductor`` puts into
    ``$TORCHINDUCTOR_CACHE_DIR`` when it finds it unset (as importing diffusers with torchao installed does),
    spelled as ``torch._inductor.runtime.cache_dir_utils.default_cache_dir`` spells it (importing that module
    imports Inductor: seconds)."""
    import getpass
    import re
    import tempfile

    return os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser()))


def cache_dir() -> Path:
    """``$TORCHINDUCTOR_CACHE_DIR`` where the user set it, else ``$XDG_CACHE_HOME/shardsmith/inductor`` (also where
    torch set it to its temporary default itself)."""
    env = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if env and env != _torch_default_dir():
        return Path(env)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "shardsmith" / "inductor"


def use_cache_dir() -> Path:
    """Point Inductor at :func:`cache_dir` (before the first compile) and return it."""
    d = cache_dir()
    d.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(d)
    return d


def cache_key(identity: dict[str, Any], shape: tuple[int, ...], dtype: str, torch_version: str,
              device_name: str, mode: str) -> str:
    blob = json.dumps([identity, list(shape), dtype, torch_version, device_name, mode], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _marker(d: Path) -> dict[str, Any]:
    try:
        return json.loads((d / _MARKER).read_text())
    except (OSError, ValueError):
        return {}


def is_warm(key: str, d: Path | None = None) -> bool:
    return key in _marker(d or cache_dir())


def mark_warm(key: str, info: dict[str, Any], d: Path | None = None) -> None:
    d = d or cache_dir()
    data = _marker(d)
    data[key] = info
    tmp = d / f".{_MARKER}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, d / _MARKER)
