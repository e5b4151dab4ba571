"""The Python API: ``shardsmith.build``, ``distill``, ``scan``, ``verify``, ``inspect`` and ``repair``, each the
CLI command of that name as a function with a typed result.

Contract
- Each function wraps the function the CLI command calls (``build.build``, ``scan.scan``,
  ``verify.runner.verify``, ``verify.inspect.inspect_wds`` + ``verify.empty_batches.diagnose_empty``,
  ``verify.repair.repair_wds``) and returns a frozen dataclass: the fields a caller tests
  (counts, ``ok``, paths) typed, and the whole report as ``.report`` (``.manifest`` for a build),
  the same dict as the command's ``--json``.
- A recipe is a path to a YAML recipe, a dict (paths relative to ``base_dir``, default the working
  directory) or a :class:`~shardsmith.recipe.Recipe`. ``build`` and ``scan`` also take a dataset
  folder or table path as the one source (a ``wds`` output, as ``shardsmith build DATASET.csv``).
- A user's mistake raises :class:`~shardsmith.errors.UserError` (the CLI's exit code 2); a failed
  check is a result with ``ok`` False, not an exception.
- ``shardsmith.build``, ``shardsmith.scan`` and ``shardsmith.verify`` are also the modules of those
  names (``import shardsmith.build`` keeps working): calling the module calls the function here
  (:func:`callable_module`). Importing this module imports nothing heavy (no torch).
"""

from __future__ import annotations

import os
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Union

RecipeLike = Union[str, os.PathLike, Mapping[str, Any], "Recipe"]  # noqa: F821 - shardsmith.recipe.Recipe


@dataclass(frozen=True)
class Counts:
    """``inputs = written + sum(skipped) + sum(failed)``; reasons are short codes (``too_small`` ...)."""

    inputs: int
    written: int
    skipped: dict[str, int] = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, d: Mapping[str, Any]) -> "Counts":
        return cls(int(d["inputs"]), int(d["written"]), dict(d.get("skipped") or {}), dict(d.get("failed") or {}))


@dataclass(frozen=True)
class OutputResult:
    name: str
    format: str
    counts: Counts
    splits: dict[str, Counts]  # "train", "holdout"


@dataclass(frozen=True)
class BuildResult:
    out: Path
    manifest_path: Path
    counts: Counts  # every input of the recipe
    outputs: dict[str, OutputResult]  # by output name
    warnings: list[str]
    manifest: dict[str, Any]  # manifest.json as written

    @property
    def written(self) -> int:
        return self.counts.written


@dataclass(frozen=True)
class ScanResult:
    items: int
    usable: int
    kinds: dict[str, int]  # image, video, audio, other
    problems: list[dict[str, Any]]
    warnings: list[str]
    estimate: dict[str, Any]  # per output: estimated bytes
    report: dict[str, Any]  # `shardsmith scan --json`


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    dataset: Path
    checks: list[Check]
    report: dict[str, Any]  # `shardsmith verify --json`

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]


@dataclass(frozen=True)
class InspectResult:
    ok: bool
    dataset: Path
    shards: int
    samples: int
    usable_samples: int
    problems: list[Any]
    diagnosis: dict[str, Any]  # FastGen's empty-batch checklist
    report: dict[str, Any]  # `shardsmith inspect --json`


@dataclass(frozen=True)
class RepairResult:
    ok: bool  # no errors
    dataset: Path
    dry_run: bool
    actions: dict[str, str]  # shard -> unchanged | rewritten | ...
    errors: list[Any]
    report: dict[str, Any]  # `shardsmith repair --json`


def _recipe(recipe: RecipeLike, base_dir: str | os.PathLike | None):
    """A :class:`Recipe` from a path (YAML recipe, or a dataset folder/table as the one source of a
    ``wds`` output), a dict or a Recipe."""
    from shardsmith.recipe import Recipe, load_recipe, recipe_from_dict
    from shardsmith.sources.base import TABLE_EXTENSIONS

    if isinstance(recipe, Recipe):
        return recipe
    if isinstance(recipe, Mapping):
        return recipe_from_dict(dict(recipe), base_dir=base_dir or Path.cwd(), origin="<dict>")
    path = Path(recipe)
    if path.is_dir() or path.suffix.lower().lstrip(".") in TABLE_EXTENSIONS:
        from shardsmith.cli import _dataset_file

        if path.is_dir() or _dataset_file(path):
            return recipe_from_dict({"sources": [{"path": str(path)}], "outputs": [{"format": "wds"}]},
                                    base_dir=base_dir or Path.cwd(), origin=str(path))
    return load_recipe(path)


def build(recipe: RecipeLike, out: str | os.PathLike, *, overwrite: bool = False, quiet: bool = True,
          workers: int | None = None, base_dir: str | os.PathLike | None = None, report: bool = False) -> BuildResult:
    """Build every output of ``recipe`` into ``out`` (``shardsmith build``): resumable, every input
    accounted for; returns the counts per output and split and the manifest. ``report=True``: then write
    ``out/report.html`` too, as the CLI does by default."""
    from shardsmith.build import build as run_build

    out = Path(out)
    return _result(out, run_build(_recipe(recipe, base_dir), out, overwrite=overwrite, quiet=quiet, workers=workers,
                                  report=report))


def distill(recipe: RecipeLike, out: str | os.PathLike, *, overwrite: bool = False, quiet: bool = True,
            workers: int | None = None, base_dir: str | os.PathLike | None = None) -> BuildResult:
    """Sample the teacher on every training prompt of ``recipe`` (a ``kd_wds`` output) into ``out``
    (``shardsmith distill``): pairs and trajectories, resumable, every prompt accounted for."""
    from shardsmith.distill.run import distill as run_distill

    return _result(Path(out), run_distill(_recipe(recipe, base_dir), out, overwrite=overwrite, quiet=quiet,
                                          workers=workers))


def _result(out: Path, manifest: dict[str, Any]) -> BuildResult:
    outputs = {name: OutputResult(name, o["format"], Counts.of(o["counts"]),
                                  {s: Counts.of(c) for s, c in o.get("splits", {}).items()})
               for name, o in manifest["outputs"].items()}
    return BuildResult(out, out / "manifest.json", Counts.of(manifest["counts"]), outputs,
                       list(manifest.get("warnings", [])), manifest)


def scan(recipe: RecipeLike, *, batch: int | None = None, updates: int | None = None, max_repeat: float = 20.0,
         grad_accum: int = 1, world: int = 1, base_dir: str | os.PathLike | None = None) -> ScanResult:
    """Dry-run ``recipe``'s planner and decode, writing nothing (``shardsmith scan``); the enough-data
    estimate sees ``batch x grad_accum x world x updates`` samples."""
    from shardsmith.scan import scan as run_scan

    rep = run_scan(_recipe(recipe, base_dir), batch=batch, updates=updates, max_repeat=max_repeat,
                   grad_accum=grad_accum, world=world)
    return ScanResult(int(rep["items"]), int(rep["usable"]), dict(rep["kinds"]), list(rep["problems"]),
                      list(rep["warnings"]), dict(rep.get("estimate") or {}), rep)


def verify(dataset: str | os.PathLike, *, preset: str | None = None, key_map: dict[str, str] | None = None,
           world: int = 2, workers: int = 2, batch_size: int | None = None, batches: int | None = None,
           image_size: int | None = None, contract_in: str = "auto", **options: Any) -> VerifyResult:
    """Iterate the real loader over ``world`` ranks x ``workers`` and check coverage, counts and the
    batch contract (``shardsmith verify``); ``options`` go to the runner as they are."""
    from shardsmith.verify.runner import verify as run_verify

    rep = run_verify(dataset, preset=preset, key_map=key_map, world=world, workers=workers, batch_size=batch_size,
                     batches=batches, image_size=image_size, contract_in=contract_in, **options)
    checks = [Check(c["name"], bool(c["ok"]), str(c.get("detail", ""))) for c in rep.get("checks", [])]
    return VerifyResult(bool(rep["ok"]), Path(dataset), checks, rep)


def inspect(dataset: str | os.PathLike, *, key_map: dict[str, str] | None = None, world: int = 1,
            workers: int = 1) -> InspectResult:
    """Per shard: members, missing members, truncation, unsafe members, count files; then FastGen's
    empty-batch checklist for ``world`` x ``workers`` (``shardsmith inspect``)."""
    from shardsmith.verify.empty_batches import diagnose_empty
    from shardsmith.verify.inspect import inspect_wds

    _folder(dataset, "inspect")
    rep = inspect_wds(dataset, key_map)
    rep["diagnosis"] = diagnose_empty(rep, world, workers)
    t = rep.get("totals", {})
    return InspectResult(bool(rep["ok"]), Path(dataset), int(t.get("shards", 0)), int(t.get("samples", 0)),
                         int(t.get("usable_samples", 0)), list(rep.get("problems", [])), rep["diagnosis"], rep)


def repair(dataset: str | os.PathLike, *, dry_run: bool = False, from_source: bool = False) -> RepairResult:
    """Rewrite damaged shards from their intact samples, or from the sources (``shardsmith repair``)."""
    from shardsmith.verify.repair import repair_wds

    _folder(dataset, "repair")
    rep = repair_wds(dataset, dry_run=dry_run, from_source=from_source)
    actions = {name: s.get("action", "") for name, s in (rep.get("shards") or {}).items()}
    return RepairResult(not rep.get("errors"), Path(dataset), bool(rep.get("dry_run", dry_run)), actions,
                        list(rep.get("errors") or []), rep)


def _folder(dataset: str | os.PathLike, what: str) -> None:
    from shardsmith.cli import _wds_folder

    _wds_folder(Path(dataset), what)


class _ApiModule(types.ModuleType):
    """A module that, called, runs the API function of its name (see :func:`callable_module`)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return globals()[self.__dict__["_api_function"]](*args, **kwargs)


def callable_module(name: str, function: str) -> None:
    """Make module ``name`` callable as :func:`function` of this module: ``shardsmith.build`` is both
    the module ``shardsmith/build.py`` (Python sets a package's attribute to its submodule on every
    ``import shardsmith.build``) and ``shardsmith.build(recipe, out)``."""
    mod = sys.modules[name]
    mod._api_function = function
    mod.__class__ = _ApiModule
