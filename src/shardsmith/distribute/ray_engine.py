"""The ``ray`` distributor: the unit jobs of an output's split as calls on Ray actors, one per GPU.

Contract
- ``run_ray(...)`` connects to Ray (``distribute.address``: ``auto``, ``ray://host:port``, or None: a
  local cluster started for this build) and makes one :class:`UnitActor` per device (``num_gpus=1``
  each on GPUs; the test hook ``SHARDSMITH_WORKER_DEVICES=cpu,cpu`` asks for CPUs), each holding its
  models, its decode workers and the output's maker, renderer and sink, built once.
- The driver owns the ledger: it reads each pending unit's items from it and sends ``(job, items)`` to
  the next free actor; the actor writes the unit's file on the filesystem every node sees (the build
  folder) and returns the unit's record; the driver commits each record as it comes back. Units are
  planned before any actor starts and a unit's bytes depend only on its items, so the files are those
  of a one-process build. A unit whose actor fails (its node lost) is left pending and written by the
  build's own pass afterwards; the rest go on. (``SHARDSMITH_WORKER_EXIT="<rank>:<units>"``, tests: that
  actor's process exits as it is given the unit after its first ``<units>``.)
- ``models.compile``: the driver keeps the build's record before the actors start (``auto``: eager, as the actors
  cannot agree on a decision through the ledger; a record kept earlier holds), and each actor follows it.
- Returns the manifest block (engine, address, devices, each actor's units and samples).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from shardsmith import formats


class _Recorder:
    """Stands in for the ledger where an actor writes a unit: keeps the unit's record for the driver
    (``commit_unit`` arguments) instead of writing SQLite on another node."""

    def __init__(self, ledger):
        self.ledger = ledger  # read-only use: the items of the output's first unit for distill.preview
        self.records: list[dict[str, Any]] = []

    def commit_unit(self, **kw: Any) -> None:
        self.records.append(kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.ledger, name)


class UnitActor:
    """One GPU's worker (a Ray actor's class): models, decode pool, maker, renderer and sink, built once."""

    def __init__(self, spec, output: str, split: str) -> None:
        from shardsmith.encode.compile_record import compile_record
        from shardsmith.encode.preload import warms_up
        from shardsmith.encode.stage import EncodeStage
        from shardsmith.outputs import OutputContext, kind_of
        from shardsmith.parallel import Workers
        from shardsmith.plan.ledger import Ledger
        from shardsmith.sources import open_sources

        recipe = spec.recipe.model_copy(deep=True)
        recipe.models.device = spec.device
        if spec.threads:  # Ray gives an actor of one CPU one thread: compute as the build would
            import torch

            torch.set_num_threads(spec.threads)
        self.spec, self.split = spec, split
        self.pool = Workers(spec.decode_workers)
        self.stage = EncodeStage.from_recipe(recipe)
        # models.compile as the driver kept it (keep_for_readers): an actor reads the ledger, never writes it
        self.stage.compile_record = compile_record(recipe, spec.root, read_only=True)
        if warms_up(self.stage) and (recipe.encode_buckets() or recipe.audio_encode_seconds()):
            self.stage.warm_up_for(recipe)  # (the compile decided, and compiled, before any batch is staged)
        self.ledger = Ledger(spec.root / formats.LEDGER_FILE)  # read only (sources' infos, the preview's items)
        infos = [info for info, _ in open_sources(recipe)]
        self.output = next(o for o in recipe.outputs if o.name == output)
        kind = kind_of(self.output)
        self.recorder = _Recorder(self.ledger)
        octx = OutputContext(recipe, spec.root, self.recorder, infos, lambda: self.stage)
        self.kind, self.octx, self.recipe = kind, octx, recipe
        self.maker = kind.maker(self.output, octx)
        self.sink = kind.sink(self.output, octx, kind.dest(spec.root, self.output, split), split)
        self.renderer = kind.renderer(self.output, octx)
        if spec.rank and hasattr(self.renderer, "preview"):
            self.renderer.preview = None
        self.units = self.samples = 0

    def run_unit(self, job, items: list) -> dict[str, Any]:
        """Write unit ``job`` from its planned ``items``; its record (``Ledger.commit_unit`` arguments)."""
        from shardsmith.distribute import local
        from shardsmith.distribute.gpus import exit_after
        from shardsmith.encode.finisher import LatentFinisher
        from shardsmith.progress import Progress

        after = exit_after(self.spec.rank)
        if after is not None and self.units >= after:
            os._exit(1)  # the test hook (as the local workers'): this actor's node is lost mid-run
        finisher = LatentFinisher(self.renderer, self.stage)
        run = local.SplitRun(self.output, self.split, self.recipe.source_ids(self.output), self.recorder,
                             self.maker, self.sink, self.kind.per_unit(self.output), False, Progress(quiet=True),
                             finisher, {})
        try:
            local._Writer(run, job.seq, job.first_pos, len(items), 0, None).run(
                self.pool, ((job.seq, job.first_pos + k, it) for k, it in enumerate(items)))
        finally:
            finisher.close()
        rec = self.recorder.records.pop()
        self.units += 1
        self.samples += rec["count"]
        return rec

    def stats(self) -> dict[str, Any]:
        return {"rank": self.spec.rank, "device": self.spec.device, "units": self.units, "samples": self.samples,
                "encode_seconds": {k: round(v, 3) for k, v in self.stage.seconds.items()},
                "node": os.uname().nodename}


def run_ray(recipe, root: Path, output, split: str, devs: list[str], decode_workers: int, ledger,
            address: str | None, progress=None) -> dict[str, Any]:
    """Run ``output``'s pending units of ``split`` on one Ray actor per device (see the module contract)."""
    from shardsmith.distribute.gpus import PoolSpec, _threads, progress_row
    from shardsmith.distribute.local import SplitRun, pending_jobs
    from shardsmith.precheck import import_optional
    from shardsmith.progress import Progress
    from shardsmith.units.job import unit_items

    ray = import_optional("ray", "shardsmith[ray]", "distribute.engine: ray (--engine ray)")
    from shardsmith.encode.compile_record import keep_for_readers
    from shardsmith.recipe import LATENT_OUTPUTS

    if isinstance(output, LATENT_OUTPUTS):  # models.compile: the actors follow the record kept here
        keep_for_readers(ledger, recipe)
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address, include_dashboard=False, log_to_driver=False,
                 num_cpus=None if address else max(len(devs), 2), ignore_reinit_error=True)
    t0 = time.perf_counter()
    actors: list = []
    try:
        gpu = all(d.startswith("cuda") for d in devs)
        per = max(1, decode_workers // len(devs))
        actor_cls = ray.remote(num_gpus=1 if gpu else 0, num_cpus=1)(UnitActor)
        actors += [actor_cls.remote(PoolSpec(recipe, root, r, "cuda" if gpu else d, per, os.getpid(),
                                            _threads()), output.name, split)
                  for r, d in enumerate(devs)]
        srcs = recipe.source_ids(output)
        probe = SplitRun(output, split, srcs, ledger, None, None, _per_unit(output), False, Progress(quiet=True))
        jobs, _ = pending_jobs(probe)
        queue, running, failed = list(jobs), {}, []
        free = list(range(len(actors)))
        with progress_row(progress, ledger, output, split, srcs, len(devs)) as poll:
            while queue or running:
                while queue and free:
                    job, a = queue.pop(0), free.pop(0)
                    items = list(unit_items(ledger, job, srcs))
                    running[actors[a].run_unit.remote(job, items)] = (job, a)
                ready, _ = ray.wait(list(running), num_returns=1)
                job, a = running.pop(ready[0])
                try:
                    ledger.commit_unit(**ray.get(ready[0]))
                    free.append(a)
                except Exception as exc:  # noqa: BLE001 - a lost actor: its unit stays pending for the build
                    failed.append({"seq": job.seq, "actor": a, "error": f"{type(exc).__name__}: {exc}"[:300]})
                poll()
        stats = []
        for a, act in enumerate(actors):
            try:
                stats.append(ray.get(act.stats.remote()))
            except Exception as exc:  # noqa: BLE001
                stats.append({"rank": a, "device": devs[a], "error": f"{type(exc).__name__}"})
        return {"engine": "ray", "address": address or "local", "devices": devs, "gpus": len(devs),
                "seconds": round(time.perf_counter() - t0, 3), "workers": stats, "failed_units": failed}
    finally:
        for act in actors:
            ray.kill(act)
        if started_here:
            ray.shutdown()


def _per_unit(output) -> int:
    from shardsmith.outputs import kind_of

    return kind_of(output).per_unit(output)
