"""diffusers' model classes, imported in shardsmith's own process without its optional peft integration.

Contract
- ``diffusers_class(name)`` returns ``getattr(diffusers, name)`` (``AttributeError`` where diffusers has no
  such class).
- With :data:`HIDE_PEFT` on (the CLI turns it on: the process is shardsmith's) and peft not imported yet,
  the class is imported while diffusers' ``is_peft_available()`` answers False, and the answer is put back
  right after: later calls of diffusers see the installed peft as before.
- Why: where peft is installed, importing a diffusers model class imports ``diffusers.hooks`` and
  ``diffusers.loaders.lora_base``, which import peft, which imports transformers' auto classes and, through
  them, scikit-learn: seconds of import time before the first batch (BENCHMARKS.md §7), for nothing
  shardsmith uses (it loads no adapters). What those modules then leave out is their handling of peft's
  layers, which shardsmith's models never hold; a library caller's process (``HIDE_PEFT`` off) keeps all of
  it, since its own code may use LoRA adapters with diffusers later.
- Otherwise (the flag off, peft imported already, or a diffusers without the flag) a plain import.
"""

from __future__ import annotations

import sys
import threading

HIDE_PEFT = False  # set by shardsmith.cli: the CLI's process loads no adapters
_LOCK = threading.Lock()


def diffusers_class(name: str):
    with _LOCK:
        import diffusers
        import diffusers.utils.import_utils as flags

        had = getattr(flags, "_peft_available", None)
        if not HIDE_PEFT or "peft" in sys.modules or not had:
            return getattr(diffusers, name)
        flags._peft_available = False
        try:
            return getattr(diffusers, name)
        finally:
            flags._peft_available = had
