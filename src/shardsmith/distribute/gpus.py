"""The ``gpus`` distributor: one worker process per GPU, started with the build, claiming units of each
output's split.

Contract
- ``devices(setting)``: the devices of ``distribute.gpus`` (``cuda:0`` .. ``cuda:N-1``; ``all``: every
  visible GPU); more than torch sees is a :class:`~shardsmith.precheck.DeviceError`. The environment
  variable ``SHARDSMITH_WORKER_DEVICES`` (``cpu,cpu``) replaces the list: the test hook that runs the
  same code with CPU "devices".
- ``GpuWorkers(recipe, root, devs, decode_workers).start()`` spawns the workers as the build starts, so
  their imports, model loads and warm-up run while the build plans. Each (a ``spawn`` process: its own
  interpreter, CUDA context, models on its device and decode workers) then serves one task per output
  split, in the build's order. ``described()`` waits for worker 0's models and returns their
  description (the manifest's ``models``; its ``stamp``), re-raising a worker's load error.
- ``run_split(output, split, ledger, progress, ahead)``: the workers take the split's pending units one
  at a time (``Ledger.claim``: the first to ask gets it), write each unit's file and commit its record,
  exactly as the one-process build does; returns the manifest block once every live worker has
  finished the split. With ``ahead`` (the plan still runs in its own process), a unit is taken once it
  is final (:func:`final_units`): the workers start on the plan's first rows. Every unit's bytes depend
  only on its items (on a GPU every batch is padded to one shape, and cuDNN's choice of kernels is
  deterministic: :mod:`shardsmith.encode.stage`), so the files are the same whoever writes them.
  A worker reads its tasks only once its models are loaded, so the first loaded starts first.
- A worker that dies or fails leaves its claimed unit uncommitted; the block lists it under ``died``
  with its exit code and error, the build says so, and the caller's one-process pass
  (``local.run_split``) writes what is still pending. ``close()`` ends the workers (they also end
  with the build's process, however it dies).
- ``SHARDSMITH_WORKER_EXIT="<rank>:<units>[,<rank>:<units>...]"`` (tests): that worker exits with code 1 as it
  claims the unit after its first ``<units>`` of a split, mid-run, leaving that claim uncommitted.
"""

from __future__ import annotations

import contextlib
import queue as queue_mod
import traceback
import multiprocessing as mp
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardsmith import formats
from shardsmith.units.plan import UnitJob

DEVICES_ENV = "SHARDSMITH_WORKER_DEVICES"
EXIT_ENV = "SHARDSMITH_WORKER_EXIT"


def devices(setting: int | str) -> list[str]:
    """``[]`` for one GPU (the build's own process encodes)."""
    if setting == 1:
        return []
    env = os.environ.get(DEVICES_ENV)
    if env:
        return [d.strip() for d in env.split(",") if d.strip()]
    import torch

    from shardsmith.precheck import DeviceError

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    n = count if setting == "all" else int(setting)
    if count == 0 or n > count:
        raise DeviceError(f"distribute.gpus (--gpus) is {setting}, but torch sees {count} CUDA device(s) here; "
                          f"use --gpus {max(count, 1)} or fewer" + (" (or all)" if count else ""))
    return [f"cuda:{i}" for i in range(n)]


def exit_after(rank: int) -> int | None:
    """The test hook (``SHARDSMITH_WORKER_EXIT``, see the module contract): the units worker ``rank`` writes
    before it exits, or None."""
    hooks = dict(part.split(":") for part in os.environ.get(EXIT_ENV, "").split(",") if part)
    return int(hooks[str(rank)]) if str(rank) in hooks else None


class _Claims:
    """The units this worker claims, one at a time as its stream asks for them."""

    def __init__(self, ledger, output: str, split: str, rank: int):
        self.ledger, self.output, self.split, self.rank = ledger, output, split, rank
        self.taken = 0
        self.exit_after = exit_after(rank)

    def __call__(self, jobs: Iterable[UnitJob]) -> Iterator[UnitJob]:
        for job in jobs:
            if self.ledger.claim(self.output, self.split, job.seq, self.rank):
                if self.exit_after is not None and self.taken >= self.exit_after:
                    os._exit(1)  # the test hook: dies holding an uncommitted claim
                self.taken += 1
                yield job


POLL_S = 0.2  # how often a worker ahead of the plan looks for its next final unit


def final_units(ledger, output: str, split: str, sources: list[int], per_unit: int,
                poll_s: float = POLL_S) -> Iterator[UnitJob]:
    """Units of ``output``'s ``split`` in order, each once it is final, while the plan still runs in another
    process (:mod:`shardsmith.plan.ahead`): unit ``seq`` once ``(seq + 1) * per_unit`` items are eligible, the
    last once the ledger says ``plan_complete``. The same units :func:`~shardsmith.units.plan.plan_units` gives
    the complete plan."""
    seq = 0
    while True:
        complete = bool(ledger.get_meta("plan_complete"))  # read first: every row counted after it is final
        n = ledger.eligible(split, sources)
        while (seq + 1) * per_unit <= n:
            yield UnitJob(output, split, seq, seq * per_unit, (seq + 1) * per_unit)
            seq += 1
        if complete:
            if seq * per_unit < n:
                yield UnitJob(output, split, seq, seq * per_unit, n)
            return
        time.sleep(poll_s)


@dataclass(frozen=True)
class SplitTask:
    """One output's split for every worker; ``ahead``: the plan is still running (take final units)."""

    output: str
    split: str
    ahead: bool


@dataclass(frozen=True)
class StageCall:
    """A call of the worker's encode stage (``method(*args)``) whose result comes back: the few encodings
    the build makes itself (an output's negative-prompt embedding)."""

    method: str
    args: tuple


@dataclass
class PoolSpec:
    """What one worker needs (picklable; a Ray actor's too): the recipe, the build folder, its rank, its device
    and its decode processes."""

    recipe: Any
    root: Path
    rank: int
    device: str
    decode_workers: int
    parent: int  # the build's PID: the worker ends with it
    threads: int | None = None  # the build's torch intra-op threads: a CPU "device" computes as the build would


def _error(exc: BaseException) -> dict[str, Any]:
    """A worker's error for the build: its text (the last lines of the traceback) and the exception
    itself where it pickles (a user's mistake keeps its type: the CLI's message and exit code)."""
    import pickle

    text = f"{type(exc).__name__}: {exc}\n" + "".join(traceback.format_exc().splitlines(keepends=True)[-12:])
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - its text is enough
        exc = None
    return {"text": text, "exc": exc}


def pool_worker(spec: PoolSpec, tasks, results) -> None:
    """One worker: models on its device (loaded and warmed up first), its decode pool, then each task
    as it comes (None ends it). Reports ``("ready", rank, info)``, ``("done", rank, stats)`` per task, or
    ``("error", rank, text)`` before it exits with code 1."""
    from shardsmith.encode import diffusers_import
    from shardsmith.import_notices import quiet_import_notices
    from shardsmith.parallel import Workers, exit_with_parent
    from shardsmith.plan.ledger import Ledger

    exit_with_parent(spec.parent)  # a build killed with -9 takes its workers with it
    quiet_import_notices()  # (a spawned interpreter: the CLI's logging settings are not inherited)
    diffusers_import.allow()  # (nor is the CLI's permission)
    if spec.threads:
        import torch

        torch.set_num_threads(spec.threads)
    t0 = time.perf_counter()
    recipe = spec.recipe.model_copy(deep=True)
    recipe.models.device = spec.device
    pool = ledger = stage = None
    try:
        pool = Workers(spec.decode_workers)  # forked before any model or thread
        from shardsmith.encode.compile_record import compile_record
        from shardsmith.encode.preload import warms_up
        from shardsmith.encode.stage import EncodeStage
        from shardsmith.sources import open_sources

        ledger = Ledger(spec.root / formats.LEDGER_FILE)
        stage = EncodeStage.from_recipe(recipe)
        stage.compile_record = compile_record(recipe, spec.root)  # models.compile: every worker follows one decision
        loaded = time.perf_counter() - t0
        if warms_up(stage) and (recipe.encode_buckets() or recipe.audio_encode_seconds()):
            stage.warm_up_for(recipe)  # cuDNN's kernels chosen (and the compile decided) while the build plans
        infos = [info for info, _ in open_sources(recipe)]
        results.put(("ready", spec.rank, {"load_s": round(loaded, 3), "ready_s": round(time.perf_counter() - t0, 3),
                                          "described": stage.describe(),
                                          "specs": {name: enc.spec for name, enc in stage.encoders.items()}}))
        while (task := tasks.get()) is not None:
            if isinstance(task, StageCall):
                results.put(("result", spec.rank, getattr(stage, task.method)(*task.args)))
            else:
                results.put(("done", spec.rank, _run_task(spec, recipe, ledger, stage, pool, infos, task)))
    except BaseException as exc:  # noqa: BLE001 - reported to the build, which writes what is left
        try:
            results.put(("error", spec.rank, _error(exc)))
            results.close()
            results.join_thread()  # the message is in the pipe before the process ends
        finally:
            os._exit(1)
    finally:
        if stage is not None:
            stage.close()
        if pool is not None:
            pool.close()
        if ledger is not None:
            ledger.close()


def _run_task(spec: PoolSpec, recipe, ledger, stage, pool, infos, task: SplitTask) -> dict[str, Any]:
    """Write the units of one output split this worker claims; its figures."""
    from shardsmith.distribute import local
    from shardsmith.encode.finisher import LatentFinisher
    from shardsmith.outputs import OutputContext, kind_of
    from shardsmith.progress import Progress

    t0 = time.perf_counter()
    launched, seconds = stage.launched, dict(stage.seconds)
    output = next(o for o in recipe.outputs if o.name == task.output)
    kind = kind_of(output)
    octx = OutputContext(recipe, spec.root, ledger, infos, lambda: stage)
    dest = kind.dest(spec.root, output, task.split)
    renderer = kind.renderer(output, octx)
    if spec.rank and hasattr(renderer, "preview"):
        renderer.preview = None  # (distill.preview: the first worker's to write)
    finisher = LatentFinisher(renderer, stage)
    sources, per_unit = recipe.source_ids(output), kind.per_unit(output)
    run = local.SplitRun(output, task.split, sources, ledger, kind.maker(output, octx),
                         kind.sink(output, octx, dest, task.split), per_unit, False, Progress(quiet=True), finisher, {})
    claims = _Claims(ledger, output.name, task.split, spec.rank)
    claiming = time.perf_counter()  # (the output's sink and maker are made)
    stage.mark_start(claiming)
    units = (final_units(ledger, output.name, task.split, sources, per_unit) if task.ahead
             else local.ORDER(local.pending_jobs(run)[0]))
    try:
        local.run_split(run, pool, units=claims(units))
    finally:
        finisher.close()
    return {"rank": spec.rank, "device": spec.device, "units": claims.taken, "samples": stage.launched - launched,
            "seconds": round(time.perf_counter() - t0, 3), "setup_s": round(claiming - t0, 3),
            "steady_state": stage.steady_state(),  # (the worker's encoder since it started)
            "encode_seconds": {k: round(v - seconds.get(k, 0.0), 3) for k, v in stage.seconds.items()}}


@contextlib.contextmanager
def progress_row(progress, ledger, output, split: str, sources: list[int], n: int):
    """A progress row for the workers' units: ``poll()`` moves it to the positions the ledger holds."""
    if progress is None:
        yield lambda: None
        return

    def done() -> int:
        return sum(u["next_pos"] - u["first_pos"] for u in ledger.units(output.name, split))

    with progress.task(f"{output.name}/{split} on {n} GPUs", total=ledger.eligible(split, sources),
                       completed=done()) as tick:
        def poll() -> None:
            tick.advance(done() - tick.completed)
        yield poll
        poll()


def _threads() -> int:
    import torch

    return torch.get_num_threads()


class GpuWorkers:
    """The build's GPU workers (see the module contract)."""

    def __init__(self, recipe, root: Path, devs: list[str], decode_workers: int):
        self.recipe, self.root, self.devs = recipe, Path(root), devs
        self.per = max(1, decode_workers // len(devs))
        self.procs: list = []
        self.ready: dict[int, dict[str, Any]] = {}
        self.errors: dict[int, str] = {}
        self.started = time.perf_counter()

    def start(self) -> "GpuWorkers":
        ctx = mp.get_context("spawn")
        self.results = ctx.Queue()
        self.tasks = [ctx.Queue() for _ in self.devs]
        threads = _threads()
        self.procs = [ctx.Process(target=pool_worker, name=f"shardsmith-gpu{r}",
                                  args=(PoolSpec(self.recipe, self.root, r, d, self.per, os.getpid(),
                                                 threads), self.tasks[r], self.results))
                      for r, d in enumerate(self.devs)]
        for p in self.procs:
            p.start()
        return self

    def _take(self, timeout: float) -> tuple | None:
        """The next worker message (booked), or None after ``timeout`` seconds."""
        try:
            kind, rank, body = self.results.get(timeout=timeout)
        except queue_mod.Empty:
            return None
        if kind == "ready":
            self.ready[rank] = body
        elif kind == "error":
            self.errors[rank] = body
        return kind, rank, body

    def raise_if_failed(self) -> None:
        """Cheap (at most every 0.2 s; meant to be called per planned item): raise the load error once
        every worker has failed before loading its models, so a wrong model path stops a long plan."""
        now = time.monotonic()
        if now - getattr(self, "_checked", 0.0) < 0.2:
            return
        self._checked = now
        while self._take(0) is not None:
            pass
        if not self.ready and not any(self.alive(r) for r in range(len(self.devs))):
            self.described()  # raises the load's error

    def alive(self, rank: int) -> bool:
        return rank not in self.errors and self.procs[rank].is_alive()

    def described(self) -> dict[str, Any]:
        """Worker 0's models, described (waits for its load; another worker's if worker 0 failed). When every
        worker has failed before loading, the first one's error is raised: a model that cannot load."""
        while True:
            if 0 in self.ready:
                return self.ready[0]["described"]
            if not self.alive(0) and self.ready:
                return next(iter(self.ready.values()))["described"]
            if not any(self.alive(r) for r in range(len(self.devs))):
                while self._take(0.2) is not None:  # the messages they sent before they ended
                    pass
                if self.ready:
                    continue
                err = self.errors.get(0) or next(iter(self.errors.values()), None)
                if err is not None and err["exc"] is not None:
                    raise err["exc"]
                raise RuntimeError(f"the GPU worker on {self.devs[0]} could not load its models: "
                                   + (err["text"] if err else f"it exited with code {self.procs[0].exitcode}"))
            self._take(0.5)

    def call(self, method: str, *args: Any) -> Any:
        """``method(*args)`` on the encode stage of the first live worker with its models loaded (between
        splits: the workers are idle); a worker that fails meanwhile passes the call to the next."""
        for r in sorted(self.ready):
            if not self.alive(r):
                continue
            self.tasks[r].put(StageCall(method, args))
            while self.alive(r):
                msg = self._take(0.5)
                if msg is not None and msg[0] == "result" and msg[1] == r:
                    return msg[2]
        raise RuntimeError(f"no GPU worker is left to run {method}: "
                           + "; ".join(e["text"].splitlines()[0] for e in self.errors.values()))

    def run_split(self, output, split: str, ledger, progress=None, ahead=None) -> dict[str, Any]:
        """Every live worker writes the units of ``output``'s ``split`` it claims; the manifest block."""
        ledger.clear_claims(output.name, split)
        t0 = time.perf_counter()
        pending = {r for r in range(len(self.devs)) if self.alive(r)}
        for r in pending:
            self.tasks[r].put(SplitTask(output.name, split, ahead is not None))
        stats: dict[int, dict[str, Any]] = {}
        with progress_row(progress, ledger, output, split, self.recipe.source_ids(output), len(self.devs)) as poll:
            while pending:
                msg = self._take(0.5)
                if msg is not None and msg[0] == "done":
                    stats[msg[1]] = msg[2]
                    pending.discard(msg[1])
                pending = {r for r in pending if self.alive(r) or r in stats}
                if ahead is not None and ahead.done:
                    ahead.wait()  # a failed plan raises here (the build then ends the workers)
                poll()
        wall = time.perf_counter() - t0
        workers = []
        for r, (p, d) in enumerate(zip(self.procs, self.devs)):
            w = stats.get(r) or {"rank": r, "device": d}
            w["exit_code"] = 0 if r in stats else (p.exitcode if p.exitcode is not None else 1)
            if r in self.errors:
                w["error"] = self.errors[r]["text"].splitlines()[0]
            if r in self.ready:
                w["load_s"], w["ready_s"] = self.ready[r]["load_s"], self.ready[r]["ready_s"]
            if w.get("samples") is not None and w.get("seconds"):
                w["samples_per_s"] = round(w["samples"] / w["seconds"], 3)
            workers.append(w)
        died = [w["rank"] for w in workers if w["exit_code"] != 0]
        if progress is not None:
            for w in workers:
                if w["exit_code"] != 0:
                    progress.say(f"warning: the GPU worker on {w['device']} stopped (exit code {w['exit_code']}"
                                 f"{': ' + w['error'] if w.get('error') else ''}); this process writes what it left")
        done = sum(w.get("samples") or 0 for w in workers)
        return {"gpus": len(self.devs), "devices": self.devs, "seconds": round(wall, 3), "workers": workers,
                "samples_per_s": round(done / wall, 3) if wall else None, "died": died}

    def close(self, wait_s: float = 30.0) -> None:
        """End the workers: each finishes its task queue's end marker, or is terminated after ``wait_s``."""
        for r, q in enumerate(self.tasks if self.procs else []):
            if self.procs[r].is_alive():
                q.put(None)
        deadline = time.monotonic() + wait_s
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.terminate()
                p.join(5)


class _SpecOnly:
    """An encoder of a GPU worker, as the build's process sees it: its spec (shapes, dtypes)."""

    def __init__(self, spec):
        self.spec = spec


class DescribedStage:
    """The build's stand-in for an encode stage whose models live in the GPU workers: worker 0's
    description (``describe()``, the manifest's ``models``), the cache ``stamp``, each encoder's spec
    (``vae.spec`` ...) and ``text(captions)``, run on a worker. It encodes no batch."""

    def __init__(self, workers: GpuWorkers):
        info = workers.ready.get(0) or next(iter(workers.ready.values()))
        self._workers, self._described = workers, info["described"]
        self.image_decoder = self._described.get("image_decoder")
        specs = info["specs"]
        self.vae, self.text_encoder, self.audio_vae, self.teacher = (
            _SpecOnly(specs[n]) if n in specs else None for n in ("vae", "text", "audio_vae", "teacher"))

    def describe(self) -> dict[str, Any]:
        """Worker 0's description, its ``compile`` block as the workers decided (kept in the ledger at their
        first batch, after worker 0 described itself)."""
        from shardsmith.encode.compile_record import compile_record

        record = compile_record(self._workers.recipe, self._workers.root) if "compile" in self._described else None
        kept = record.kept() if record is not None else None
        return self._described if kept is None else {**self._described,
                                                     "compile": {**self._described["compile"], **kept}}

    def stamp(self, recipe) -> dict[str, Any]:
        from shardsmith.encode.stage import EncodeStage

        return EncodeStage.stamp(self, recipe)  # the same identities, from the same description

    def text(self, captions: list[str]) -> list:
        return self._workers.call("text", list(captions))

    def close(self) -> None:
        pass
