"""What a build does with an ``--out`` that already exists.

Contract
- ``refuse_foreign(out, overwrite)``: a file, or a folder holding anything no shardsmith build
  wrote, is never built into nor replaced (``--overwrite`` only replaces a build): refused with
  :class:`OutputExistsError` naming what it holds, before anything is written or locked.
- ``check_existing(out, fp, recipe, overwrite)`` (with ``out``'s lock held) decides: ``"fresh"``,
  ``"resume"``, ``"done"``, ``"reset"`` (a build of another recipe that committed no unit: its
  files go, then fresh) or ``"sibling"`` (``--overwrite``: build beside it, swap in when done);
  a build of a different recipe without ``overwrite`` is refused with the recipe differences.
"""

from __future__ import annotations

from pathlib import Path

from shardsmith import formats
from shardsmith.errors import UserError
from shardsmith.plan.ledger import Ledger
from shardsmith.recipe import Recipe, canonical, diff_recipes
from shardsmith.safety import outdir, swap


class OutputExistsError(UserError, RuntimeError):
    """The output folder holds something this build must not overwrite."""


_ONLY_BUILDS = ", and --overwrite only ever replaces a previous shardsmith build"


def refuse_foreign(out: Path, overwrite: bool) -> None:
    """See the module contract."""
    if out.exists() and not out.is_dir():
        raise OutputExistsError(f"{out} exists and is a file, not a shardsmith build; shardsmith never replaces "
                                "it (not even with --overwrite). Choose another --out")
    if not out.is_dir() or outdir.is_build(out) or swap.vacant(out) or not any(out.iterdir()):
        return
    listed = outdir.foreign_files(out)
    more = f" (and {len(listed) - 10} more)" if len(listed) > 10 else ""
    raise OutputExistsError(
        f"{out} is not empty and was not written by shardsmith (not a shardsmith build: no {formats.LEDGER_FILE}); "
        f"refusing to write into it{_ONLY_BUILDS if overwrite else ''}. "
        f"It holds: {', '.join(listed[:10])}{more}. Choose an empty --out")


def _has_units(ledger_path: Path) -> bool:
    led = Ledger(ledger_path)
    try:
        return led.db.execute("SELECT 1 FROM shards LIMIT 1").fetchone() is not None
    finally:
        led.close()


def check_existing(out: Path, fp: str, recipe: Recipe, overwrite: bool) -> str:
    """Decide what to do with ``out`` (its lock held): 'fresh', 'resume', 'done', 'reset' (a
    build of another recipe that committed no unit: its files go, then fresh) or 'sibling'."""
    if swap.vacant(out) or not any(out.iterdir()):
        return "fresh"
    ledger_path = out / formats.LEDGER_FILE
    if not ledger_path.exists():
        state = out / formats.STATE_DIR
        if [p.name for p in out.iterdir()] == [formats.STATE_DIR] and state.is_dir() and \
                {p.name for p in state.iterdir()} <= {Path(formats.LOCK_FILE).name}:
            return "fresh"  # killed between creating its state folder and its ledger: nothing to keep
        refuse_foreign(out, overwrite)
    old_fp, old_recipe, done = Ledger.peek(ledger_path, "fingerprint", "recipe", "complete")
    if old_fp is None and Ledger.never_started(ledger_path):
        return "resume"  # killed between creating its ledger and recording its recipe: nothing to keep
    if old_fp == fp:
        if overwrite:  # complete or not: from the sources as they are now (a resume keeps the plan it made)
            return "sibling"
        return "done" if done else "resume"
    if old_fp is not None and not done and not _has_units(ledger_path):
        return "reset"  # it stopped (a source or recipe error) before writing anything: not a build to keep
    if overwrite:
        return "sibling"
    diffs = diff_recipes(old_recipe or {}, canonical(recipe))
    raise OutputExistsError(
        f"{out} holds a build of a different recipe; refusing to mix versions. Differences:\n  "
        + "\n  ".join(diffs[:20]) + "\nUse another --out, re-run the original recipe to resume it, "
        "or pass --overwrite to rebuild (the old output stays until the new one is complete).")
