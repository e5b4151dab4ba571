"""Where a build keeps what ``models.compile`` did, so that its resume, and each of its ``--gpus`` workers,
encodes as the build began: compiled and eager latents differ in their last bits.

Contract
- ``CompileRecord(ledger_path, sources)``: the build's ledger and the sources its latent outputs encode
  (one list per output). Every call opens a connection of its own, so any thread may call it.
- ``kept()``: the record (``{"compiled": bool, "reason": str}``), or None before the build first decided.
- ``keep(entry)``: records ``entry`` unless a record is there already (the first worker to decide wins) and
  returns the record that holds. A ``read_only`` record (a Ray actor's, which does not write the ledger) writes
  nothing: its driver kept the build's record first (:func:`keep_for_readers`).
- ``written()``: whether the build has committed results (latents written before this process decided).
- ``planned()``: ``(items, complete)``: the ``ok`` items planned so far for the latent outputs (all splits),
  and whether the plan is complete (while it runs ahead, ``items`` grows).
- :func:`compile_record(recipe, root, read_only=)`: the record of the build writing ``root`` (None without a
  latent output).
- :func:`keep_for_readers(ledger, recipe)`: the driver of workers that do not write the ledger keeps the record
  for them before they start: ``on`` compiled, ``off`` eager, ``auto`` eager (they could not agree on a decision
  of their own); a record already kept (a resume) holds. :func:`set_in_recipe`: the reason kept for ``on``/``off``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LEDGER_KEY = "models_compile"


@dataclass(frozen=True)
class CompileRecord:
    ledger_path: Path
    sources: tuple[tuple[int, ...], ...]  # per latent output: the sources it encodes
    read_only: bool = False

    @contextlib.contextmanager
    def _ledger(self):
        from shardsmith.plan.ledger import Ledger

        led = Ledger(self.ledger_path)
        try:
            yield led
        finally:
            led.close()

    def kept(self) -> dict[str, Any] | None:
        with self._ledger() as led:
            return led.get_meta(LEDGER_KEY)

    def keep(self, entry: dict[str, Any]) -> dict[str, Any]:
        if self.read_only:
            return self.kept() or entry
        with self._ledger() as led:
            return led.keep_meta(LEDGER_KEY, entry)

    def written(self) -> bool:
        with self._ledger() as led:
            return led.has_results()

    def planned(self) -> tuple[int, bool]:
        with self._ledger() as led:
            complete = bool(led.get_meta("plan_complete"))  # read first: every row counted after it is final
            return sum(led.eligible(None, list(s)) for s in self.sources), complete


def compile_record(recipe, root: Path, read_only: bool = False) -> CompileRecord | None:
    """The record of the build writing ``root`` with ``recipe``; None where no output encodes latents."""
    from shardsmith.formats.build_dir import LEDGER_FILE
    from shardsmith.recipe import LATENT_OUTPUTS

    sources = tuple(tuple(recipe.source_ids(o)) for o in recipe.outputs if isinstance(o, LATENT_OUTPUTS))
    return CompileRecord(Path(root) / LEDGER_FILE, sources, read_only) if sources else None


def keep_for_readers(ledger, recipe) -> dict[str, Any]:
    """Keep (in the driver's ``ledger``) the record its read-only workers follow; returns the record that holds."""
    setting = recipe.models.compile
    if setting == "auto":
        entry = {"compiled": False, "reason": "auto: eager on the Ray engine, whose workers do not write the ledger "
                                              "to agree on a decision (set models.compile: on to compile)"}
    else:
        entry = {"compiled": setting == "on", "reason": set_in_recipe(setting)}
    return ledger.keep_meta(LEDGER_KEY, entry)


def set_in_recipe(setting: str) -> str:
    """The reason kept for ``on`` and ``off``."""
    return f"{setting} in the recipe (models.compile)"
