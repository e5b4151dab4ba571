"""``build``: sources -> plan (ledger) -> split -> transform -> sinks -> manifest.

Contract
- ``build(recipe, out)`` writes every output of the recipe under ``out`` and returns the
  manifest dict (also written to ``out/manifest.json``).
- An ``out`` that equals, contains or lies inside a source is refused before anything is
  written, with or without ``overwrite`` (:mod:`shardsmith.safety.outdir`).
- The build holds ``out``'s exclusive lock (``.shardsmith/lock``) for its whole life, swap
  included; a second build (or repair) of the folder is refused at once, naming this PID.
- An ``out`` holding anything no shardsmith build wrote is refused, never replaced. A build of
  a different recipe is refused with :class:`OutputExistsError` unless ``overwrite``; then the
  new build goes to a hidden sibling folder and is swapped in only when complete, and only the
  files the old build's ledger recorded are removed: the user's files move into the new folder.
  A different recipe's build that committed no unit (it stopped on an error) is reset instead.
- Once the plan is complete and before the outputs are written past it: a holdout that leaves
  an output no training item is refused with the counts, and a build whose estimated remaining
  bytes exceed the free space of ``out`` is refused with a ``du``-style summary. Before both, an
  output whose planned items are all of kinds it does not take (audio files where nothing encodes
  audio, images without a bucket of 1 frame, captions for a media output) is refused with the message
  of the check made from file names before the plan (:mod:`shardsmith.precheck`). With each of these refusals (and
  a source of which the plan found nothing) what the first output wrote ahead of the plan is removed and the plan
  is left unfinished: the corrected recipe's re-run starts afresh, and the same command re-run once the sources
  are fixed plans them again.
- A full disk, quota or file-size limit mid-write ends in one :class:`~shardsmith.safety.space.
  OutOfSpaceError` naming the file; re-running the same command resumes.
- Re-running after a crash (even ``kill -9``) resumes from the last committed unit and
  yields byte-identical files. Re-running a finished build is a no-op.
- Every planned item ends with a terminal status in every output that takes its source;
  the reconciliation invariant is checked before the manifest is written.
- An output that writes no sample while another output writes some is one warning on stderr (``--quiet`` too; again
  when the finished build is re-run) naming it, its counts by reason and the fix, and its manifest block's ``empty``
  (inputs, counts by reason); the build succeeds. Where no output writes a sample the CLI exits 3 instead.
- With ``report=True`` (the CLI's default) ``out/report.html`` (``report_html``) is written last;
  a report that fails is one warning on stderr, never the build's failure.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from shardsmith import __version__, formats, process_exit
from shardsmith.distribute import local
from shardsmith.errors import UserError
from shardsmith.manifest import InvariantError, make_manifest, summary
from shardsmith.outputs import OutputContext, kind_of, needs_encoders
from shardsmith.parallel import Workers
from shardsmith.plan.ledger import Ledger, is_read_only_error
from shardsmith.plan.planner import make_plan
from shardsmith.progress import Progress, count_in_background, total_in_background
from shardsmith.recipe import Recipe, RecipeError, canonical, fingerprint
from shardsmith.records import WRITTEN, SourceInfo
from shardsmith.safety import estimate, holdout, outdir, space, swap
from shardsmith.safety.existing import OutputExistsError, check_existing, refuse_foreign
from shardsmith.safety.lock import cannot_write, hold
from shardsmith.atomic import atomic_write_json, read_json, remove_stale_tmp
from shardsmith.sources import open_sources, paths
from shardsmith.sources.base import count_listed
from shardsmith.split.assign import HOLDOUT, TRAIN
from shardsmith.user_paths import resolve_user_path

__all__ = ["InvariantError", "OutputExistsError", "build", "output_dest"]


@dataclass
class SpaceNeed:
    """Bytes the outputs still need (the pre-write estimate; None until made or when not estimated)."""

    needed: int | None = None
    out: Path | None = None  # the --out folder whose contents a refusal summarises


@dataclass
class BuildContext:
    recipe: Recipe
    root: Path  # the folder being written (``out`` or its hidden sibling)
    ledger: Ledger
    sources: list[SourceInfo]
    progress: Progress
    stage: Any = None  # EncodeStage when the recipe has latent outputs, once loaded (use _stage(ctx))
    preload: Any = None  # ModelPreload loading it meanwhile
    plan_ahead: bool = False  # the plan runs ahead of the first output
    outputs_started: float = 0.0  # perf_counter() when the first output started
    makers: dict[str, Any] | None = None  # output name -> picklable sample maker
    timings: dict[str, Any] | None = None  # wall seconds per phase of this run (manifest "timings")
    need: SpaceNeed | None = None  # the pre-write estimate of the bytes still to write
    pool: Workers | None = None
    checked: bool = False  # the complete plan was checked (holdout, free space)
    memo: Any = None  # EncodedMemo when several outputs need the encoders (each item encoded once)
    devices: list[str] | None = None  # distribute.gpus's devices, once resolved ([]: one process)
    gpu_workers: Any = None  # GpuWorkers (--gpus N, the local engine): the models live there
    stage_lock: Any = field(default_factory=threading.RLock)  # _stage: the main thread, or a sink's writer thread
    asked_decoder: str | None = None  # images.decoder as the recipe wrote it (the ledger's), before settling


def _splits(recipe: Recipe) -> list[str]:
    return [TRAIN, HOLDOUT] if recipe.split.holdout > 0 and not recipe.one_sample else [TRAIN]


def output_dest(root: Path, output, split: str) -> Path:
    return kind_of(output).dest(root, output, split)


def _ignore_sigxfsz() -> None:
    """A write past ``ulimit -f`` then fails with EFBIG (one message) instead of killing the process."""
    if hasattr(signal, "SIGXFSZ") and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def build(recipe: Recipe, out: str | os.PathLike, *, overwrite: bool = False, quiet: bool = False,
          workers: int | None = None, console=None, report: bool = False) -> dict[str, Any]:
    """Build ``recipe`` into ``out`` (see the module contract); the manifest. ``report=True`` (the
    CLI's default, ``--no-report`` turns it off): then write ``out/report.html``
    (:mod:`shardsmith.report_html`); a report that fails is a warning on stderr, never the
    build's failure (the build is complete on disk by then)."""
    manifest = _build_locked(recipe, out, overwrite=overwrite, quiet=quiet, workers=workers, console=console)
    if report:
        report_after_build(Path(out))
    return manifest


def report_after_build(out: Path) -> Path | None:
    """Write ``out``'s HTML report unless one newer than its manifest is there (a finished
    build re-run stays a no-op); on failure, one warning line on stderr and None."""
    import sys

    from shardsmith.formats.build_dir import REPORT_FILE

    dest = out / REPORT_FILE
    try:
        if dest.is_file() and dest.stat().st_mtime >= (out / formats.MANIFEST_FILE).stat().st_mtime:
            return dest
        from shardsmith.report_html import write_report

        return write_report(out)
    except Exception as exc:  # the build is complete: a report that cannot be written is only a warning
        sys.stderr.write(f"warning: the build is complete, but its HTML report could not be written "
                         f"({type(exc).__name__}: {exc}); retry with: shardsmith report {out}\n")
        return None


def _build_locked(recipe: Recipe, out: str | os.PathLike, *, overwrite: bool = False, quiet: bool = False,
                  workers: int | None = None, console=None) -> dict[str, Any]:
    from shardsmith.precheck import check_hub_cache, precheck

    out = resolve_user_path(out, "--out")  # (a symlink loop: one message)
    precheck(recipe)  # what needs only the recipe fails here, before any folder, plan or model
    check_hub_cache(recipe)  # offline, a hub id not in the cache: said now, not as the models load beside the plan
    t_enter = time.perf_counter()
    outdir.refuse_around_sources(out, [(s.name, s.path) for s in recipe.sources])
    refuse_foreign(out, overwrite)
    _ignore_sigxfsz()
    fp = fingerprint(recipe)
    progress = Progress(quiet=quiet, console=console)
    nxt = swap.next_sibling(out)
    created = not out.exists()
    with contextlib.ExitStack() as locks:
        # the lock of --out (and of the sibling an --overwrite builds in) for the whole build and swap
        locks.enter_context(hold(out, "build", read_only=True))  # a complete build may be re-checked read-only
        if created:  # a mistake found before anything is written leaves no folder behind (see _unmake)
            locks.push(lambda exc_type, exc, tb: _unmake(out, exc))
        held_next = nxt.is_dir()
        if held_next:
            locks.enter_context(hold(nxt, "build"))
        _say_carried(progress, swap.finish_interrupted(out))
        mode = check_existing(out, fp, recipe, overwrite)
        if mode == "done":
            manifest = _finished_manifest(out, recipe)  # a damaged one is said before "nothing to do"
            # a run killed after its manifest (while writing the HTML report) leaves a temporary file
            if remove_stale_tmp(out):
                progress.say("removed the temporary file(s) of a run killed after it finished")
            progress.say(f"{out} already holds this build, complete; nothing to do (pass --overwrite to rebuild)")
            _warn_if_sources_changed(out, recipe, f"{out} holds the build of the sources as they were then; pass "
                                     "--overwrite to rebuild from them as they are now (the old output stays until "
                                     "the new one is complete)")
            _warn_empty_outputs(_empty_outputs(manifest))  # said again, as the CLI says a build that wrote nothing
            return manifest
        if mode == "reset":
            progress.say(f"{out} holds a build of another recipe that stopped before writing anything; starting afresh")
            outdir.remove_owned(out, keep_lock=True)
            mode = "fresh"
        root = out if mode in ("fresh", "resume") else nxt
        if mode == "sibling":
            if not nxt.exists():  # a mistake found before the new build writes anything leaves no sibling
                locks.enter_context(hold(nxt, "build"))
                locks.push(lambda exc_type, exc, tb: _unmake(nxt, exc))
            elif not held_next or not (nxt / formats.LOCK_FILE).exists():  # (an emptied sibling was pruned)
                locks.enter_context(hold(nxt, "build"))
            if outdir.is_build(root) and Ledger.peek(root / formats.LEDGER_FILE, "fingerprint")[0] != fp:
                # a half-built other recipe; the lock kept (this build holds it) is no user's file
                left = [f for f in outdir.remove_owned(root, keep_lock=True) if f != formats.LOCK_FILE]
                if left:
                    raise OutputExistsError(f"{root} (left by an earlier --overwrite) holds files shardsmith did not "
                                            f"write: {', '.join(left[:10])}; move them away and re-run")
        n_workers = workers or recipe.workers or default_workers()
        need = SpaceNeed(out=out)
        try:
            manifest = _build_in(recipe, root, fp, progress, n_workers, exclude=[out, root], t_enter=t_enter,
                                 need=need, rebuild_of=out if root != out else None)
        except (OSError, sqlite3.OperationalError) as exc:
            if not space.is_full(exc):
                if _unwritable_in(exc, root):
                    raise cannot_write(root, exc, "build") from None
                raise
            raise space.write_failed(exc, root, root / formats.LEDGER_FILE, need.needed) from None
        if root != out:
            _say_carried(progress, swap.swap_in(root, out))
            progress.say(f"swapped the new build into {out}")
    return manifest


_MANIFEST_FIX = ("restore manifest.json from a copy, or pass --overwrite to rebuild (the old output stays until the "
                 "new one is complete)")


def _finished_manifest(out: Path, recipe: Recipe | None = None) -> dict[str, Any]:
    """The manifest of the finished build in ``out``; a missing or damaged one is a :class:`UserError`
    naming it (the build's files are complete: it is the manifest alone that must be restored). Damaged:
    not JSON, not an object, not the shape the CLI, the API, ``report`` and ``verify`` read
    (:func:`~shardsmith.verify.owning_build.manifest_shape_problem`: ``counts.written`` lost, ``outputs``
    lost ...), or, given the ``recipe`` of the build, without an entry for each of its outputs (or with
    one of another output)."""
    from shardsmith.verify.owning_build import manifest_shape_problem, outputs_mismatch

    mpath = out / formats.MANIFEST_FILE
    try:
        manifest = read_json(mpath)
    except (OSError, ValueError) as exc:
        why = exc.strerror or str(exc) if isinstance(exc, OSError) else f"not valid JSON: {exc}"
        raise UserError(f"{mpath} cannot be read ({why}); the build in {out} is complete but its manifest is "
                        f"damaged: {_MANIFEST_FIX}") from None
    if not isinstance(manifest, dict):
        raise UserError(f"{mpath} holds a JSON {type(manifest).__name__}, not a shardsmith manifest; {_MANIFEST_FIX}")
    why = manifest_shape_problem(manifest)
    if why is None and recipe is not None:
        why = outputs_mismatch(manifest["outputs"], [o.name for o in recipe.outputs])
    if why is not None:
        raise UserError(f"{mpath} is damaged ({why}); the build in {out} is complete but its manifest is not what "
                        f"the build wrote: {_MANIFEST_FIX}")
    return manifest


def _say_carried(progress: Progress, carried: list[str]) -> None:
    if carried:
        more = f" and {len(carried) - CARRIED_SHOWN} more" if len(carried) > CARRIED_SHOWN else ""
        progress.say(f"kept {len(carried)} file(s) of yours that the replaced build did not write (moved into "
                     f"the new build, never deleted): {', '.join(carried[:CARRIED_SHOWN])}{more}")


CARRIED_SHOWN = 10  # the carried files named in that line (a repair quarantine may hold thousands)


def _unmake(out: Path, exc: BaseException | None) -> bool:
    """Exit hook of a build that created ``out``: when it stops on a user's mistake (:class:`UserError`) and
    ``out`` holds nothing but the build's state (the lock and a ledger that planned nothing), remove ``out``.
    Anything else there is kept. Never swallows the exception (returns False)."""
    if not isinstance(exc, UserError) or not out.is_dir():
        return False
    state = out / formats.STATE_DIR
    if [p.name for p in out.iterdir()] != [formats.STATE_DIR]:
        return False
    if any(p.name not in ("lock", "ledger.sqlite", "ledger.sqlite-wal", "ledger.sqlite-shm") for p in state.iterdir()):
        return False
    try:
        if Ledger.holds_items(state / "ledger.sqlite"):
            return False
    except sqlite3.Error:
        return False
    try:
        shutil.rmtree(out, ignore_errors=True)
    except Exception:  # noqa: BLE001 - a clean-up never hides the user's error it follows
        pass
    return False


def _unwritable_in(exc: BaseException, root: Path) -> bool:
    """Whether ``exc`` is a refused write into the build folder ``root`` (no permission, read-only disk; SQLite's
    "readonly database" / "unable to open database file" for the ledger there)."""
    if isinstance(exc, sqlite3.OperationalError):
        return is_read_only_error(exc)
    if not isinstance(exc, OSError) or exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR):
        return False
    name = exc.filename
    return name is not None and paths.within(os.path.realpath(os.fspath(name)), os.path.realpath(root))


def _warn_if_sources_changed(root: Path, recipe: Recipe, consequence: str) -> None:
    """One warning line on stderr (shown with ``--quiet`` too) when files were added to, changed in or
    removed from the sources since ``root``'s plan (:mod:`~shardsmith.safety.source_changes`)."""
    import sys

    from shardsmith.safety.source_changes import source_changes
    from shardsmith.sources.base import SourceError

    ledger_path = root / formats.LEDGER_FILE
    started = Ledger.peek(ledger_path, "started")[0]
    since = datetime.fromisoformat(started).timestamp() - 1 if started else float("inf")
    try:
        changes = source_changes(ledger_path, open_sources(recipe, exclude=[root]), since)
    except (SourceError, OSError, sqlite3.Error) as exc:
        sys.stderr.write(f"warning: could not check whether the sources changed since {root} was planned "
                         f"({exc})\n")
        return
    if changes:
        sys.stderr.write(f"warning: the sources changed since this build was planned: {changes.summary()}; "
                         f"{consequence}\n")


def default_workers() -> int:
    """Decode workers when neither ``--workers`` nor the recipe says: every core on a small machine, all
    but two on a large one (the main process and the encoder's thread need theirs), at least 8 where there
    are 8."""
    cores = os.cpu_count() or 1
    return max(1, min(cores, max(8, cores - 2)))


def _build_in(recipe: Recipe, root: Path, fp: str, progress: Progress, n_workers: int,
              exclude: list[Path], t_enter: float, need: SpaceNeed, rebuild_of: Path | None = None) -> dict[str, Any]:
    """Plan (or resume) and write ``recipe``'s build in ``root``; ``rebuild_of``: the folder an ``--overwrite``
    rebuild in ``root`` (its sibling) replaces once complete."""
    root.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(root / formats.LEDGER_FILE)
    try:
        if ledger.get_meta("fingerprint") is None:
            with ledger.transaction():  # all or none: a ledger never holds a fingerprint without its recipe
                ledger.set_meta("fingerprint", fp)
                ledger.set_meta("recipe", canonical(recipe))
                ledger.set_meta("version", __version__)
                ledger.set_meta("started", datetime.now(timezone.utc).isoformat(timespec="seconds"))
        if needs_encoders(recipe):  # (no torch: NVML says whether there is a GPU, so the plan and the workers
            # start without it, and the model loader imports it beside the plan)
            from shardsmith.encode.decoder_choice import settle

            recipe = settle(recipe, ledger, n_workers)  # images.decoder, as this build began (kept in the ledger)
            from shardsmith.encode import offload

            recipe = offload.settle(recipe, ledger)  # models.offload where no GPU must be asked (kept in the ledger)
            from shardsmith.encode import resample

            recipe = resample.settle(recipe, ledger)  # audio.resampler, as this build began (kept in the ledger)
        stale = remove_stale_tmp(root)
        if stale:
            progress.say(f"resuming: removed {len(stale)} uncommitted temporary file(s)")
        t = time.perf_counter()
        opened = open_sources(recipe, exclude=exclude)
        infos = [i for i, _ in opened]
        setup = {"prepare_s": round(t - t_enter, 3),  # output folder checks, ledger
                 "open_sources_s": round(time.perf_counter() - t, 3)}
        ahead = None
        plan_needed = not ledger.get_meta("plan_complete")
        if not plan_needed:  # a resume: the plan stands, whatever the folders hold now
            distill = any(o.format == "kd_wds" for o in recipe.outputs)  # (a distill fails an edited prompt: 859e5ef)
            edited = ("an edited prompt fails as changed_since_plan" if distill
                      else "an edited caption is written as it was planned")
            _warn_if_sources_changed(root, recipe, "this build goes on with the files as planned (a changed file "
                                     f"fails as changed_since_plan, {edited}, a new one is not in it); " + (
                                         "pass --overwrite to start again from the sources as they are now"
                                         if rebuild_of is None else
                                         f"this --overwrite resumes the rebuild an earlier --overwrite began in "
                                         f"{root} (it holds only that unfinished rebuild; {rebuild_of} stays as it "
                                         f"is until a rebuild completes): remove {root} and re-run with "
                                         "--overwrite to plan again from the sources as they are now"))
        if plan_needed:
            _remove_written_ahead(root, ledger, progress)
            shutil.rmtree(root / formats.ENCODED_DIR, ignore_errors=True)  # kept by plan position
            ledger.reset_plan()
            t = time.perf_counter()
            ahead = _start_plan_ahead(recipe, root, ledger, opened, n_workers)  # forks: before any thread
            setup["start_plan_s"] = round(time.perf_counter() - t, 3)
        try:
            t = time.perf_counter()
            pool = Workers(n_workers)  # fork the workers now, while this process is small and before any model
            setup["start_workers_s"] = round(time.perf_counter() - t, 3)
            try:
                return _plan_and_write(recipe, root, fp, progress, ledger, opened, infos, pool, setup,
                                       plan_needed, ahead, need)
            finally:
                pool.close()
        finally:
            if ahead is not None:
                ahead.close()
    finally:
        ledger.close()


def _start_plan_ahead(recipe: Recipe, root: Path, ledger: Ledger, opened, n_workers: int):
    """Start the plan in its own process when the first output may begin before it completes
    (:func:`_ahead_output`); returns the :class:`~shardsmith.plan.ahead.PlanAhead` or None."""
    output = _ahead_output(recipe, root)
    if output is None and not _plan_apart(recipe):
        return None
    from shardsmith.plan.ahead import PlanAhead

    if output is not None:
        # recorded before anything is written ahead: a crash before the plan completes removes it on
        # the next run (it was derived from a plan that is then redone)
        ledger.set_meta("written_ahead", [output_dest(root, output, TRAIN).relative_to(root).as_posix()])
    # ahead: a few probe processes of its own, the build's workers decode for the output meanwhile; apart:
    # as many as the build has, which wait for the plan
    probes = n_workers if output is None else 1 if n_workers <= 1 else max(2, n_workers // 4)
    ahead = PlanAhead(recipe, ledger.path, opened, probe_workers=probes).start()
    ahead.output = output
    return ahead


def _plan_apart(recipe: Recipe) -> bool:
    """Whether a plan that does not run ahead of an output runs in a process of its own anyway (and is
    waited for): where this process loads models meanwhile, whose imports hold the interpreter lock for
    seconds (BENCHMARKS.md §7), on one GPU; not with models.offload text-first (its text pass reads the
    plan) nor in one-sample mode (a plan of one item)."""
    return (needs_encoders(recipe) and recipe.distribute.gpus == 1 and recipe.models.offload != "text-first"
            and not recipe.one_sample and PLAN_AHEAD)


def _plan_and_write(recipe: Recipe, root: Path, fp: str, progress: Progress, ledger: Ledger, opened,
                    infos: list[SourceInfo], pool: Workers, setup: dict[str, float], plan_needed: bool,
                    ahead=None, need: SpaceNeed | None = None) -> dict[str, Any]:
    """Plan (when ``plan_needed``), write every output, then the manifest. With ``ahead`` (a plan
    already running in its own process) the first output starts on the plan's committed rows."""
    t0 = time.perf_counter()
    timings: dict[str, Any] = dict(setup)  # before the plan: sources opened, workers started
    ctx = BuildContext(recipe, root, ledger, infos, progress, makers={}, timings=timings,
                       need=need or SpaceNeed(), pool=pool,
                       asked_decoder=((ledger.get_meta("recipe") or {}).get("images") or {}).get("decoder", "auto"))
    preload = None
    apart = ahead if ahead is not None and ahead.output is None else None  # a plan-first plan in its own process
    if apart is not None:
        ahead = None
    if needs_encoders(recipe):
        ctx.gpu_workers = _start_gpu_workers(ctx)  # their models load and warm up while the plan runs
        if ctx.gpu_workers is None:
            from shardsmith.encode.preload import ModelPreload

            from shardsmith.encode.offload import LEDGER_KEY, OffloadRun

            run = OffloadRun(root, ledger.path, ledger.get_meta(LEDGER_KEY), ahead, progress=progress)  # models.offload
            preload = ModelPreload(recipe, root=root).with_offload(run).start()  # models load and warm up while the plan runs
    with contextlib.ExitStack() as stack:
        if ctx.gpu_workers is not None:  # ended last; at once when the build fails (a worker may wait on the plan)
            stack.push(lambda exc_type, *_: ctx.gpu_workers.close(wait_s=0.0 if exc_type else 30.0))
        # last out: the encode stage's device thread, once its queued batches are done
        stack.callback(lambda: ctx.stage is not None and ctx.stage.close())
        if preload is not None:
            stack.push(_cancel_on_failure(ctx, preload))
        # the plan's total: the listed items, counted from the listings on a thread while the plan probes
        count = (lambda: None) if recipe.one_sample else (lambda: count_listed(opened))
        if ahead is not None:
            tick = stack.enter_context(progress.task("plan", total=None))
            count_in_background(tick, count)
            ahead.listen(tick)
        elif apart is not None:
            try:
                with progress.task("plan", total=None) as tick:
                    count_in_background(tick, count)
                    apart.listen(tick)
                    apart.wait(check=preload.raise_if_failed if preload is not None else None)
            finally:
                if preload is not None:
                    preload.planned()
        elif plan_needed:
            try:
                with progress.task("plan", total=None) as tick, total_in_background(tick, count):
                    make_plan(recipe, ledger, opened, on_item=_plan_tick(tick, preload or ctx.gpu_workers),
                              workers=pool)
            finally:
                if preload is not None:
                    preload.planned()
        if ahead is None:
            timings["plan_s"] = round(time.perf_counter() - t0, 3)
            if apart is not None:
                timings["plan_apart"] = True
            _check_plan(ctx)
        # the outputs start now; the models are waited for at their first batch (the decode workers
        # work on the first items meanwhile)
        ctx.preload, ctx.plan_ahead, ctx.outputs_started = preload, ahead is not None, time.perf_counter()
        blocks, timings["outputs_s"] = {}, {}
        for o in recipe.outputs:
            t = time.perf_counter()
            first = ahead is not None and o is ahead.output
            if ahead is not None and not first:
                ahead.wait()  # later outputs need the whole plan
                _check_plan(ctx)
            blocks[o.name] = _run_output(ctx, o, pool, ahead if first else None)
            timings["outputs_s"][o.name] = round(time.perf_counter() - t, 3)
        if ahead is not None:  # complete: its output waited for it at its end
            timings["plan_s"], timings["plan_ahead"] = ahead.seconds, True
        _stage(ctx)  # (the manifest describes the models even when no batch needed them)
    timings["total_s"] = round(time.perf_counter() - t0, 3)  # this run: a resumed build counts its own part
    manifest = make_manifest(ctx, _octx(ctx), fp, blocks)
    empty = _empty_outputs(manifest)
    for name, (block, warning) in empty.items():  # the manifest says so for that output, and among its warnings
        manifest["outputs"][name]["empty"] = block
        manifest["warnings"].append(warning)
    atomic_write_json(root / formats.MANIFEST_FILE, manifest)
    ledger.set_meta("complete", True)
    if ctx.memo is not None:  # every output is written: the kept encoder results are not needed
        ctx.memo.remove()
    if needs_encoders(ctx.recipe):
        from shardsmith.encode.text_cache import remove_cache

        remove_cache(root, ctx.stage)  # nor the text pass's embeddings (models.offload text-first)
    said_below = {f"warning: {w}" for _, w in empty.values()}
    for line in summary(manifest):
        if line not in said_below:
            progress.say(line)
    _warn_empty_outputs(empty)
    return manifest


def _empty_outputs(manifest: dict[str, Any]) -> dict[str, tuple[dict[str, Any], str]]:
    """Each output of a finished build that holds no sample while another output holds some: its name -> (the
    manifest's ``empty`` block of it: inputs and counts by reason, the warning). A build of which no output holds
    a sample is not listed: the CLI ends it with exit 3 (:func:`shardsmith.manifest.nothing_written`)."""
    outputs = manifest.get("outputs") or {}

    def written(o) -> int:
        return sum(s.get("written") or 0 for s in ((o or {}).get("splits") or {}).values() if isinstance(s, dict))

    if not any(written(o) for o in outputs.values()):
        return {}
    empty = {}
    for name, o in outputs.items():
        if written(o):
            continue
        c = (o or {}).get("counts") or {}
        by_reason = dict(sorted({**{f"failed:{r}": n for r, n in (c.get("failed") or {}).items()},
                                 **{f"skipped:{r}": n for r, n in (c.get("skipped") or {}).items()}}.items(),
                                key=lambda kv: (-kv[1], kv[0])))
        n = c.get("inputs") or 0
        if n:
            ex = (c.get("examples") or {}).get(next(iter(by_reason), ""))
            eg = f"; e.g. {ex['detail']}" if isinstance(ex, dict) and ex.get("detail") else ""
            every = "its one input failed or was skipped" if n == 1 else f"all {n} of its inputs failed or were skipped"
            why = f"{every} ({', '.join(f'{st} {k}' for st, k in by_reason.items())}{eg})"
        else:
            why = "no input was planned from its sources"
        warning = (f"output {name!r} wrote no sample, while the other output(s) did: {why}. Each item's reason is in "
                   "manifest.json and the report; fix or replace those inputs (or the setting a skip names) and run "
                   "the same command again with --overwrite, or remove the output from the recipe")
        empty[name] = ({"inputs": n, "by_reason": by_reason}, warning)
    return empty


def _warn_empty_outputs(empty: dict[str, tuple[dict[str, Any], str]]) -> None:
    """One warning line on stderr (shown with ``--quiet`` too) for each output that wrote no sample while
    another did (:func:`_empty_outputs`); the build still succeeds: what the other outputs wrote is usable."""
    import sys

    for _, warning in empty.values():
        sys.stderr.write(f"warning: {warning}\n")


def _check_plan(ctx: BuildContext) -> None:
    """Once the plan is complete, before an output writes past it: refuse a holdout that leaves
    no training data, then a build whose estimated remaining bytes exceed the free space."""
    if ctx.checked:
        return
    ctx.checked = True
    recipe, ledger = ctx.recipe, ctx.ledger
    try:
        _refuse_empty_sources(ctx.sources, ledger)
        _refuse_kinds_not_taken(recipe, ledger)
        holdout.refuse_recipe_empty_train(recipe, ledger)
    except UserError:
        _unplan(ctx)
        raise
    ests = [_estimate(ctx, o) for o in recipe.outputs]
    known = [e.needed for e in ests if e.needed is not None]
    if known:
        ctx.need.needed = sum(known)
        space.check_fits(ctx.root, ctx.need.needed, [e.describe() for e in ests], show=ctx.need.out or ctx.root)


def _unplan(ctx: BuildContext) -> None:
    """Before a refusal of the complete plan (an empty source, inputs of kinds an output does not take, a holdout
    that takes every item): leave nothing that blocks the user's fix in the same ``--out``. What the first output
    wrote ahead of the plan goes (:func:`_unwrite_ahead`), and the plan is marked unfinished, so that a re-run
    plans the sources again as they are then (files added to an empty folder are seen), where it stood complete and
    refused the fixed sources from the old plan; a corrected recipe's re-run finds a build that committed no unit,
    and starts afresh."""
    if ctx.plan_ahead:  # the first output ran ahead of the plan: it skipped what it read, and goes
        _unwrite_ahead(ctx)
    with ctx.ledger.transaction():
        ctx.ledger.db.execute("DELETE FROM meta WHERE key='plan_complete'")


def _unwrite_ahead(ctx: BuildContext) -> None:
    """Before a refusal of the recipe once the plan is complete: remove what the output that started ahead of the
    plan wrote (its folder's files this build wrote, the kept encoder results) and its records in the ledger, so
    that the refused build leaves only its plan, as one refused before its outputs start: a re-run of the
    corrected recipe then starts afresh (a build of another recipe that committed no unit is reset), where the
    empty units it had committed made it "a build of a different recipe". What goes was never kept: the refusal
    says the recipe can only be run corrected, under another fingerprint."""
    root, ledger, first = ctx.root, ctx.ledger, ctx.recipe.outputs[0]
    _remove_ahead_files(root, ledger)
    shutil.rmtree(root / formats.ENCODED_DIR, ignore_errors=True)
    with ledger.transaction():
        for table in ("results", "shards", "unit_files", "claims"):
            ledger.db.execute(f"DELETE FROM {table} WHERE output=?", (first.name,))


def _refuse_empty_sources(infos: list[SourceInfo], ledger: Ledger) -> None:
    """A source of which the plan found nothing (an empty folder, a folder of files with no media extension, a
    table without rows) is a mistake in the recipe: one message naming each, before any output is written."""
    from shardsmith.sources.base import MEDIA_EXTENSIONS, SourceError

    empty = [i for i in infos if ledger.items_of_source(i.index) == 0]
    if not empty:
        return
    what = {"folder": "no media file (hidden files and names starting with '.' are left out; media extensions: "
                      f"{', '.join(sorted(MEDIA_EXTENSIONS))})",
            "table": "no row", "wds": "no sample"}
    raise SourceError("; ".join(f"source {i.name!r} ({i.path}) holds {what.get(i.kind, 'nothing to read')}"
                                for i in empty) + ": check the path, or remove the source from the recipe")


def _refuse_kinds_not_taken(recipe: Recipe, ledger: Ledger) -> None:
    """An output whose planned inputs are all of kinds it does not take would skip every one and write nothing:
    refused once the plan is complete, before any output is written past it (the models may be loading
    meanwhile), with the message of the check made from file names before the plan
    (:mod:`shardsmith.precheck`), which cannot see a WebDataset source nor a folder past its walk's bound: a latent
    output cut to ``geometry.buckets`` of images only while no bucket has 1 frame (``skipped:no_image_bucket``);
    audio files where nothing encodes audio (:func:`~shardsmith.precheck.audio_only_error`); any other kind the
    output does not take (:func:`~shardsmith.precheck.kinds_taken`: ``skipped:unsupported_kind_<kind>``)."""
    from shardsmith.precheck import audio_only_error, kinds_taken
    from shardsmith.recipe import BUCKETED_OUTPUTS
    from shardsmith.transform.buckets import parse_buckets

    g = recipe.geometry
    no_image_bucket = not recipe.mode and bool(g.buckets) and all(b.frames != 1 for b in parse_buckets(g.buckets))
    for i, o in enumerate(recipe.outputs):
        taken = kinds_taken(recipe, o)
        ids = recipe.source_ids(o)
        if taken is None or not ids:
            continue
        bucketed = isinstance(o, BUCKETED_OUTPUTS)
        if bucketed and no_image_bucket:
            taken = taken - {"image"}
        kinds = ledger.planned_kinds(ids)
        if not kinds or kinds & taken:
            continue
        if recipe.one_sample and not (kinds == {"image"} and bucketed):
            continue  # (one item planned, the first usable: it tells nothing of the other kinds the sources hold)
        names = ", ".join(repr(recipe.sources[j].name) for j in ids)
        of = f"source {names}" if len(ids) == 1 else f"sources {names}"
        if kinds == {"image"} and bucketed:
            raise RecipeError(f"output {o.name!r}: every input it takes is an image, and geometry.buckets "
                              f"({';'.join(g.buckets)}) has no bucket of 1 frame, so each would be "
                              "skipped; add one such as 512x512x1 to geometry.buckets (--resolution-buckets)")
        if kinds == {"audio"}:
            err = audio_only_error(recipe, i, f"the plan found only audio files in {of}")
            if err is not None:
                raise err
        why = "; ".join(f"an image needs a bucket of 1 frame, and geometry.buckets ({';'.join(g.buckets)}) has none"
                        if k == "image" and bucketed else _NOT_TAKEN.get(k, "no output takes them") for k in sorted(kinds))
        takes = " and ".join(_KIND_WORDS[k] for k in sorted(taken))
        raise RecipeError(f"output {o.name!r} (outputs[{i}], {o.format}) would write nothing: every item planned from "
                          f"{of} is {' or '.join(_KIND_WORD.get(k, k) for k in sorted(kinds))}, and it takes "
                          f"{takes or 'none of them'} ({why}), so each would be skipped; give outputs[{i}] sources "
                          f"of {takes or 'other media'} (outputs[{i}].sources names them), or remove it from the recipe")


#: an item's kind in the catch-all message of _refuse_kinds_not_taken: one item, several
_KIND_WORD = {"image": "an image", "video": "a video clip", "audio": "an audio file", "text": "a caption without media",
              "other": "a file of no media type"}
_KIND_WORDS = {"image": "images", "video": "video clips", "audio": "audio files", "text": "captions without media",
               "other": "files of no media type"}
#: which outputs write an item of a kind this output does not take
_NOT_TAKEN = {"image": "images are written by wds, zip and latent outputs", "video": "video clips are written by "
              "video_wds and latent outputs", "audio": "audio files are written by precomputed and latent_wds outputs "
              "with models.audio_vae", "text": "captions without media are written by prompt_wds",
              "other": "no output takes files of no media type"}


def _estimate(ctx: BuildContext, o) -> estimate.OutputEstimate:
    """Bytes output ``o`` still has to write (see :mod:`shardsmith.safety.estimate`)."""
    srcs = ctx.recipe.source_ids(o)
    committed = sum(u["bytes"] for split in _splits(ctx.recipe) for u in ctx.ledger.units(o.name, split))
    counts = (ctx.ledger.eligible(TRAIN, srcs), ctx.ledger.eligible(HOLDOUT, srcs))
    if kind_of(o).encoders_for(o, ctx.recipe) or not sum(counts):
        return estimate.output_estimate(o, counts, [], committed)
    from shardsmith.scan import sample_bytes

    sizes = [sample_bytes(o, res.members or {}, item.key) if res.status == WRITTEN else None
             for item, res in ctx.pool.map(_maker(ctx, o), estimate.sample_items(ctx.ledger, srcs))]
    return estimate.output_estimate(o, counts, sizes, committed)


def _start_gpu_workers(ctx: BuildContext):
    """The GPU workers of ``--gpus N`` (the local engine), started now, when an output they can write needs
    the encoders (one with a byte budget is written here); else None."""
    recipe = ctx.recipe
    if recipe.distribute.engine != "local" or not _devices(ctx):
        return None
    if not any(kind_of(o).encoders_for(o, recipe) and not kind_of(o).byte_bounded(o) for o in recipe.outputs):
        return None
    from shardsmith.distribute.gpus import GpuWorkers

    return GpuWorkers(recipe, ctx.root, ctx.devices, ctx.pool.n).start()


def _encoding_stage(ctx: BuildContext):
    """The encode stage of this process, to encode with (not a description of the GPU workers' models):
    loaded here when the workers hold the models (the units a stopped worker left, an output with a
    byte budget)."""
    from shardsmith.distribute.gpus import DescribedStage

    if isinstance(ctx.stage, DescribedStage) or (ctx.stage is None and ctx.preload is None and ctx.gpu_workers):
        from shardsmith.encode.preload import ModelPreload

        ctx.stage, ctx.preload = None, ModelPreload(ctx.recipe, root=ctx.root).start()
    return _stage(ctx)


def _stage(ctx: BuildContext):
    """The encode stage: waits for the preload the first time (a batch is ready to encode, or the
    build ends) and books the wait; None for a recipe without latent outputs. With GPU workers, a
    :class:`~shardsmith.distribute.gpus.DescribedStage` of worker 0's models. One thread at a time (a
    ``.precomputed/`` sink stamps its tree on a writer thread, :mod:`shardsmith.sinks.precomputed`)."""
    with ctx.stage_lock:
        return _stage_locked(ctx)


def _stage_locked(ctx: BuildContext):
    if ctx.stage is None and ctx.preload is None and ctx.gpu_workers is not None:
        from shardsmith.distribute.gpus import DescribedStage

        t = time.perf_counter()
        with ctx.progress.spin(loading_label(ctx.recipe) + f" ({len(ctx.devices)} GPU workers)"):
            ctx.gpu_workers.described()  # waits for worker 0's models (raises a load that failed everywhere)
            ctx.stage = DescribedStage(ctx.gpu_workers)
        ctx.timings["load_models_s"] = round(time.perf_counter() - t, 3)  # waited for when first needed
        _say_random_weights(ctx)
    if ctx.stage is None and ctx.preload is not None:
        t = time.perf_counter()
        with ctx.progress.spin(loading_label(ctx.recipe)):
            ctx.stage = ctx.preload.result(stop_warm_up=not ctx.plan_ahead)
        ctx.timings["load_models_s"] = round(time.perf_counter() - t, 3)  # waited for when first needed
        ctx.timings["load_models_overlapped_s"] = ctx.preload.seconds.get("load")
        ctx.stage.mark_start(ctx.outputs_started)
        _offload_settled(ctx)
        _warn_if_nvml_disagrees(ctx)
        if getattr(ctx.stage, "memory", None) and ctx.stage.device == "cuda":  # measured in the warm-up
            from shardsmith.encode.memory_plan import gpu_free_total, summary

            for line in summary(ctx.stage.memory, *gpu_free_total(getattr(ctx.stage, "device_index", None))):
                ctx.progress.say("GPU memory: " + line)
        _say_random_weights(ctx)
    return ctx.stage


def _warn_if_nvml_disagrees(ctx: BuildContext) -> None:
    """``images.decoder: auto`` was settled to ``cpu-draft`` (by NVML's count, :mod:`~shardsmith.encode.nvml_count`,
    before torch was imported; or, on a resume, as the build began) and the models run on the CPU: where NVML sees
    a GPU that torch cannot use (a broken CUDA install), say what that changed. A recipe that asked for ``cpu-draft``
    itself is not warned (a ledger from before the setting holds no ``decoder``: it asked ``auto``)."""
    if ctx.asked_decoder != "auto" or ctx.recipe.images.decoder != "cpu-draft" \
            or ctx.recipe.models.device != "auto" or getattr(ctx.stage, "device", None) != "cpu":
        return
    import sys

    from shardsmith.encode.nvml_count import device_count

    if (device_count() or 0) > 0:
        sys.stderr.write("warning: NVML reports a CUDA device, but torch cannot use it: the models run on the CPU, and "
                         "JPEGs were decoded as for a GPU (images.decoder: cpu-draft, not byte-identical to PIL's full "
                         "decode, kept for this build's resumes); fix the CUDA install, or start again with models.device: cpu "
                         "and --overwrite for the exact decode\n")


def _say_random_weights(ctx: BuildContext) -> None:
    if ctx.stage.describe()["random_weights"]:
        ctx.progress.say(f"note: {', '.join(ctx.stage.describe()['random_weights'])} use RANDOM WEIGHTS: "
                         "the latents are plumbing checks, not model-space data (labelled in the manifest)")


def _offload_settled(ctx: BuildContext) -> None:
    """models.offload as the model loader settled it: kept in the ledger (a resumed build runs as it began)
    and said on a GPU, or whenever the text encoder ran first."""
    from shardsmith.encode.offload import LEDGER_KEY

    decision = getattr(ctx.stage, "offload", None)
    if decision is None:
        return
    if ctx.ledger.get_meta(LEDGER_KEY) is None:
        ctx.ledger.set_meta(LEDGER_KEY, decision.record())
    if ctx.stage.device == "cuda" or decision.mode == "text-first":
        ctx.progress.say(("GPU memory: " if ctx.stage.device == "cuda" else "models: ") + decision.line())


def loading_label(recipe: Recipe) -> str:
    """What the model-loading spinner says: each model's family and weights, and the device."""
    from shardsmith.precheck import resolve_device

    m = recipe.models
    parts = []
    for role, x in (("vae", m.vae), ("text", m.text)):
        if x is not None:
            bundled = role == "text" and x.family == "minilm"
            parts.append(f"{role} {x.family} ({x.pretrained or ('bundled weights' if bundled else 'random weights')})")
    try:
        device = resolve_device(m.device, "models.device")
    except Exception:  # noqa: BLE001 - the precheck has said what is wrong with the device
        device = m.device
    return f"load models: {', '.join(parts)} on {device}"


def _cancel_on_failure(ctx: BuildContext, preload):
    """An exit callback: a build that fails before it takes the stage stops the loading thread, and a library
    caller's waits for it (a command's process leaves at once: process_exit); the failure goes on."""
    def cancel(exc_type, *_):
        if exc_type is not None and ctx.stage is None:
            preload.cancel(wait=not process_exit.in_command())
        return False
    return cancel


def _plan_tick(tick, preload):
    def on_item() -> None:
        tick()
        if preload is not None:
            preload.raise_if_failed()  # a model that cannot load stops the plan at once
    return on_item


def _ahead_output(recipe: Recipe, root: Path):
    """The output whose train split may start before the plan is complete, or None: the first
    output, when it is a latent output that ``plans_ahead`` (the GPU would otherwise wait for the plan), the plan's
    rows are final when committed, and its folder lies strictly inside ``root`` (a crash before
    the plan completes removes that folder, never through a link: :func:`_remove_written_ahead`). The recipe
    keeps an output's folder inside ``root`` (``dir: .`` and ``..`` are refused when it is read); what still
    leads out is a link the user put in its place in the folder of a build stopped while planning, whose
    resume then plans first."""
    from shardsmith.plan.ahead import can_plan_ahead

    first = recipe.outputs[0] if recipe.outputs else None
    if not PLAN_AHEAD or first is None or not kind_of(first).encoders_for(first, recipe) or not can_plan_ahead(recipe):
        return None
    if recipe.distribute.gpus != 1 and recipe.distribute.engine != "local":  # Ray's driver plans units first
        return None
    if recipe.models.offload == "text-first":  # the text pass reads every caption before the VAE loads
        return None
    if recipe.audio_outputs() and not (AUDIO_AHEAD_ON_CPU or _gpu_encodes(recipe)):
        return None  # on a CPU the plan's probes take the audio encoder's cores: measured slower (BENCHMARKS.md §7)
    if not kind_of(first).plans_ahead:  # (a latent_zip: class-conditional or not needs the whole plan)
        return None
    dest = output_dest(root, first, TRAIN).resolve()
    return first if root.resolve() in dest.parents else None


PLAN_AHEAD = True  # tests switch it off to compare with the plan-first order
AUDIO_AHEAD_ON_CPU = False  # an output with audio plans ahead where a GPU encodes (tests switch it on for a CPU)


def _gpu_encodes(recipe: Recipe) -> bool:
    """Whether the models run on a GPU, asked of NVML without importing torch (no answer: taken as no)."""
    if recipe.models.device == "cpu":
        return False
    from shardsmith.encode.nvml_count import device_count

    return (device_count() or 0) > 0


def _remove_written_ahead(root: Path, ledger: Ledger, progress: Progress) -> None:
    """Before an unfinished plan is redone: remove what was written ahead of it (the files of
    the output that started early), which the redone plan rebuilds. Only the build's own files
    strictly inside ``root``, below a folder the ledger recorded before writing to it, go."""
    for rel, n in _remove_ahead_files(root, ledger):
        progress.say(f"resuming: the plan was unfinished; removed {rel}/ ({n} file(s) written ahead of it, "
                     "rebuilt from the redone plan)")


def _remove_ahead_files(root: Path, ledger: Ledger) -> list[tuple[str, int]]:
    """Remove the build's own files below each folder the ledger recorded before writing ahead of the plan (only
    folders strictly inside ``root``, never through a link): each such folder with the count of files removed."""
    removed = []
    for rel in ledger.get_meta("written_ahead") or []:
        path = (root / rel).resolve()
        if root.resolve() in path.parents and path.is_dir():
            removed.append((rel, outdir.remove_owned_under(root, rel)))
    return removed


def _devices(ctx: BuildContext) -> list[str]:
    """The devices of ``distribute.gpus`` (``[]``: this process encodes), resolved once per build."""
    if ctx.devices is None:
        from shardsmith.distribute.gpus import devices

        ctx.devices = devices(ctx.recipe.distribute.gpus)
    return ctx.devices


def _octx(ctx: BuildContext) -> OutputContext:
    return OutputContext(ctx.recipe, ctx.root, ctx.ledger, ctx.sources, lambda: _stage(ctx))


def _memo(ctx: BuildContext):
    """The encoded-results memo, when more than one output needs the encoders; else None."""
    if ctx.memo is None and sum(1 for o in ctx.recipe.outputs if kind_of(o).encoders_for(o, ctx.recipe)) > 1:
        from shardsmith.encode.memo import EncodedMemo

        ctx.memo = EncodedMemo(ctx.root / formats.ENCODED_DIR)
    return ctx.memo


def _maker(ctx: BuildContext, o):
    """The picklable sample maker of output ``o`` (made once the rows it reads are planned)."""
    if o.name not in ctx.makers:
        ctx.makers[o.name] = kind_of(o).maker(o, _octx(ctx))
    return ctx.makers[o.name]


def _committed(ctx: BuildContext, ahead, srcs: list[int]):
    """The train split's planned ``ok`` rows of ``srcs`` as a plan running ahead commits them (waiting for
    them; a failed model load stops the wait), or None where the plan is complete."""
    if ahead is None:
        return None
    return ahead.items(ctx.ledger, split=TRAIN, sources=srcs, check=_load_check(ctx))


def _load_check(ctx: BuildContext):
    """What a wait for the plan calls to stop at once when the models failed to load (None: none loading)."""
    return ctx.preload.raise_if_failed if ctx.preload is not None else None


def _run_output(ctx: BuildContext, output, pool: Workers, ahead=None) -> dict[str, Any]:
    """Write every split of ``output``; with ``ahead`` (a plan still running) the train split
    takes the plan's rows as they are committed, and the rest waits for the whole plan."""
    ledger, recipe, kind, octx = ctx.ledger, ctx.recipe, kind_of(output), _octx(ctx)
    srcs = recipe.source_ids(output)
    result: dict[str, Any] = {"format": output.format, "files": {}}
    cutter = getattr(_maker(ctx, output), "audio", None)  # the maker's audio settings: the output writes audio
    if cutter is not None:
        from shardsmith.safety import audio as audio_safety

        from shardsmith.encode.resample import describe

        result["audio"] = {"required": recipe.audio_required, "rate": cutter.rate,
                           "resampler": describe(cutter.resampler),
                           "preflight": audio_safety.preflight(ledger, recipe, output, cutter,
                                                               _committed(ctx, ahead, srcs)), "splits": {}}
    elif recipe.audio.skip:
        result["audio"] = {"skipped": True, "why": "--skip-audio (audio.skip): no audio latents were written"}
    splits = kind.splits(output, recipe) or _splits(recipe)
    for split in splits:
        if ahead is not None and split != TRAIN:
            ahead.wait()
            _check_plan(ctx)
        dest = output_dest(ctx.root, output, split)
        (dest.parent if dest.suffix else dest).mkdir(parents=True, exist_ok=True)
        sink = kind.sink(output, octx, dest, split)
        devs = _devices(ctx)  # (--gpus refused here comes before the finisher's threads are made)
        finisher = None
        renderer = kind.renderer(output, octx)
        if renderer is not None:
            from shardsmith.encode.finisher import LatentFinisher

            finisher = LatentFinisher(renderer, lambda: _encoding_stage(ctx), memo=_memo(ctx))
        try:  # closed however the split ends: a refusal of the complete plan below, a worker's error
            run = local.SplitRun(output, split, srcs, ledger, _maker(ctx, output), sink, kind.per_unit(output),
                                 kind.byte_bounded(output), ctx.progress, finisher,
                                 ctx.timings.setdefault("writer_wait_s", {}) if finisher is not None else {})
            check = _load_check(ctx)
            if devs and finisher is not None and not run.byte_bounded:  # --gpus N: a worker per GPU claims units
                from shardsmith.distribute.ray_engine import run_ray

                d = recipe.distribute
                if d.engine == "ray":
                    if ahead is not None:
                        ahead.wait()
                        _check_plan(ctx)
                    block = run_ray(recipe, ctx.root, output, split, devs, pool.n, ledger, d.address, ctx.progress)
                else:  # the workers take the plan's units as they become final
                    block = ctx.gpu_workers.run_split(output, split, ledger, ctx.progress,
                                                      ahead if split == TRAIN else None)
                    if ahead is not None:
                        ahead.wait()
                        _check_plan(ctx)  # a refusal of the complete plan: the finisher is closed below
                result.setdefault("distribute", {})[split] = block
                ahead = None  # (the plan is complete) and what a stopped worker left is written below
            local.run_split(run, pool, ahead if split == TRAIN else None, check=check)
        finally:
            if finisher is not None:
                finisher.close()
        info = kind.finalize(output, octx, sink, split, dest)
        for k in ("path", "dir"):
            if k in info:  # relative to the output root: the folder may be swapped into place
                info[k] = Path(info[k]).relative_to(ctx.root).as_posix()
        result["files"][split] = info
    if ahead is not None:
        ahead.wait()
        _check_plan(ctx)
    # plan-level outcomes (unreadable, duplicate ...) are this output's outcomes too
    ledger.record_results(output.name, ledger.plan_outcomes(srcs))
    for split in _splits(recipe):
        if split not in splits:  # a split the output does not write (kd_wds: the holdout)
            _skip_split(ledger, output, srcs, split)
    missing = ledger.missing_results(output.name, srcs)
    if missing:
        raise InvariantError(f"output {output.name}: {missing} planned item(s) have no terminal status; "
                             "this is a shardsmith bug, please report it with the ledger file")
    if cutter is not None:
        result["audio"]["splits"] = {split: audio_safety.audio_counts(ledger, output, split) for split in _splits(recipe)}
        audio_safety.gate(ledger, recipe, output, result["audio"]["splits"])
    return result


def _skip_split(ledger: Ledger, output, srcs: list[int], split: str, batch: int = 4096) -> None:
    """Every planned item of ``split`` gets ``skipped:holdout`` in ``output`` (it writes no such split)."""
    why = f"output {output.name!r} ({output.format}) writes the train split only; {split} items are never used"
    rows: list = []
    for item in ledger.items(split=split, sources=srcs, status="ok"):
        rows.append((item.idx, f"skipped:{HOLDOUT}", why))
        if len(rows) >= batch:
            ledger.record_results(output.name, rows)
            rows = []
    if rows:
        ledger.record_results(output.name, rows)


from shardsmith.api import callable_module  # noqa: E402 - after the module's own names

callable_module(__name__, "build")  # shardsmith.build(...) is shardsmith.api.build
