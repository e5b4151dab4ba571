"""The ``gpus`` distributor: one worker process per GPU for an output's split, claiming its units.

Contract
- ``devices(setting)``: the devices of ``distribute.gpus`` (``cuda:0`` .. ``cuda:N-1``; ``all``: every
  visible GPU); more than torch sees is a :class:`~shardsmith.precheck.DeviceError`. The environment
  variable ``SHARDSMITH_WORKER_DEVICES`` (``cpu,cpu``) replaces the list: the test hook that runs the
  same code with CPU "devices".
- ``run_workers(...)``: the unit plan of an output's split is already in the ledger; its claims are
  cleared, then each worker (a ``spawn`` process: its own interpreter, CUDA context, models on its
  device and decode workers) takes the pending units one at a time (``Ledger.claim``: the first to ask
  gets it), writes each unit's file and commits its record to the ledger, exactly as the one-process
  build does. Units are planned before any worker starts and every unit's bytes depend only on its
  items (on a GPU every batch is padded to one shape), so the files are the same whoever writes them.
  Workers claim once all have their models loaded (at most :data:`READY_WAIT_S` of waiting).
  Returns when every worker has exited; a worker that dies leaves its claimed unit uncommitted, and the
  caller's one-process pass (``local.run_split``) writes what is still pending. Each worker leaves
  ``.shardsmith/workers/<output>-<split>-<rank>.json``: its device, units, samples and seconds.
- ``SHARDSMITH_WORKER_EXIT="<rank>:<units>"`` (tests): that worker exits with code 1 as it claims the
  unit after its first ``<units>``, mid-run, leaving that claim uncommitted.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardsmith import formats
from shardsmith.formats.build_dir import STATE_DIR

DEVICES_ENV = "SHARDSMITH_WORKER_DEVICES"
EXIT_ENV = "SHARDSMITH_WORKER_EXIT"
WORKERS_DIR = f"{STATE_DIR}/workers"


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


@dataclass
class WorkerSpec:
    """What one worker needs (picklable): the recipe, the build folder, the output and split, its rank,
    the number of workers, its device and its decode processes."""

    recipe: Any
    root: Path
    output: str
    split: str
    rank: int
    world: int
    device: str
    decode_workers: int
    parent: int  # the build's PID: the worker ends with it
    threads: int | None = None  # the build's torch intra-op threads: a CPU "device" computes as the build would


class _Claims:
    """The pending units this worker claims, one at a time as its stream asks for them."""

    def __init__(self, ledger, output: str, split: str, rank: int):
        self.ledger, self.output, self.split, self.rank = ledger, output, split, rank
        self.taken = 0
        rank_s, _, after = os.environ.get(EXIT_ENV, "").partition(":")
        self.exit_after = int(after) if rank_s and int(rank_s) == rank else None

    def __call__(self, jobs):
        for job in jobs:
            if self.ledger.claim(self.output, self.split, job.seq, self.rank):
                if self.exit_after is not None and self.taken >= self.exit_after:
                    os._exit(1)  # the test hook: dies holding an uncommitted claim
                self.taken += 1
                yield job


READY_WAIT_S = 300.0  # how long a loaded worker waits for the others before it claims anyway


def _wait_for_all(ledger, output: str, split: str, rank: int, world: int) -> None:
    """Claim only once every worker has its models loaded (or after :data:`READY_WAIT_S`): a worker that
    loads first would otherwise take every unit of a short split while the others load."""
    deadline = time.monotonic() + READY_WAIT_S
    while ledger.mark_ready(output, split, rank) < world and time.monotonic() < deadline:
        time.sleep(0.1)


def worker_main(spec: WorkerSpec) -> None:
    """One worker: its models on its device, its decode pool, the units it claims (see the module contract)."""
    from shardsmith.distribute import local
    from shardsmith.encode.finisher import LatentFinisher
    from shardsmith.outputs import OutputContext, kind_of
    from shardsmith.parallel import Workers
    from shardsmith.plan.ledger import Ledger
    from shardsmith.progress import Progress
    from shardsmith.sources import open_sources

    from shardsmith.parallel import exit_with_parent

    exit_with_parent(spec.parent)  # a build killed with -9 takes its workers with it
    if spec.threads:
        import torch

        torch.set_num_threads(spec.threads)
    t0 = time.perf_counter()
    recipe = spec.recipe.model_copy(deep=True)
    recipe.models.device = spec.device
    ledger = Ledger(spec.root / formats.LEDGER_FILE)
    pool = Workers(spec.decode_workers)  # forked before any model or thread
    stage = None
    try:
        from shardsmith.encode.stage import EncodeStage

        stage = EncodeStage.from_recipe(recipe)
        infos = [info for info, _ in open_sources(recipe)]
        output = next(o for o in recipe.outputs if o.name == spec.output)
        kind = kind_of(output)
        octx = OutputContext(recipe, spec.root, ledger, infos, lambda: stage)
        dest = kind.dest(spec.root, output, spec.split)
        renderer = kind.renderer(output, octx)
        if spec.rank and hasattr(renderer, "preview"):
            renderer.preview = None  # (distill.preview: the first worker's to write)
        finisher = LatentFinisher(renderer, stage)
        run = local.SplitRun(output, spec.split, recipe.source_ids(output), ledger, kind.maker(output, octx),
                             kind.sink(output, octx, dest, spec.split), kind.per_unit(output), False,
                             Progress(quiet=True), finisher, {})
        claims = _Claims(ledger, output.name, spec.split, spec.rank)
        _wait_for_all(ledger, output.name, spec.split, spec.rank, spec.world)
        try:
            local.run_split(run, pool, claim=claims)
        finally:
            finisher.close()
        stats = {"rank": spec.rank, "device": spec.device, "units": claims.taken, "samples": stage.launched,
                 "seconds": round(time.perf_counter() - t0, 3),
                 "encode_seconds": {k: round(v, 3) for k, v in stage.seconds.items()}}
        out = spec.root / WORKERS_DIR
        out.mkdir(parents=True, exist_ok=True)
        from shardsmith.atomic import atomic_write_json

        atomic_write_json(out / f"{spec.output}-{spec.split}-{spec.rank}.json", stats)
    finally:
        if stage is not None:
            stage.close()
        pool.close()
        ledger.close()


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


def run_workers(recipe, root: Path, output, split: str, devs: list[str], decode_workers: int, ledger,
                progress=None) -> dict[str, Any]:
    """Run one worker per device on ``output``'s ``split`` until each exits; the manifest block."""
    ledger.clear_claims(output.name, split)
    ctx = mp.get_context("spawn")
    per = max(1, decode_workers // len(devs))
    procs = [ctx.Process(target=worker_main, name=f"shardsmith-gpu{r}",
                         args=(WorkerSpec(recipe, root, output.name, split, r, len(devs), d, per, os.getpid(),
                                          _threads()),))
             for r, d in enumerate(devs)]
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    with progress_row(progress, ledger, output, split, recipe.source_ids(output), len(devs)) as poll:
        while any(p.is_alive() for p in procs):
            time.sleep(0.5)
            poll()
    for p in procs:
        p.join()
    wall = time.perf_counter() - t0
    workers = []
    for r, (p, d) in enumerate(zip(procs, devs)):
        f = root / WORKERS_DIR / f"{output.name}-{split}-{r}.json"
        stats = json.loads(f.read_text()) if p.exitcode == 0 and f.is_file() else {"rank": r, "device": d}
        stats["exit_code"] = p.exitcode
        if stats.get("samples") is not None and stats.get("seconds"):
            stats["samples_per_s"] = round(stats["samples"] / stats["seconds"], 3)
        workers.append(stats)
    done = sum(w.get("samples") or 0 for w in workers)
    return {"gpus": len(devs), "devices": devs, "seconds": round(wall, 3), "workers": workers,
            "samples_per_s": round(done / wall, 3) if wall else None,
            "died": [w["rank"] for w in workers if w["exit_code"] != 0]}
