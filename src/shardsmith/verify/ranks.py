"""``verify``'s simulated ranks: ``world`` processes, each building the real loader (with its own
workers) for its rank and iterating it, as under torchrun.

A rank gets a JSON-able ``spec`` (``kind`` ``"wds"`` or ``"zip"``, the loader ``config`` without
rank and world size, ``world``, ``batches`` per rank or None for a full pass, ``contract_in`` or
``zip_len``) and puts one result on the queue: ``{"rank", "seen" (sample ids: ``shard/key`` or the
ZIP index), "contract" (a ContractRecorder), "stats", "arrivals"}``, or ``{"rank", "error",
"trace"}`` when anything raised. :class:`Ranks` starts them, collects one result per rank (sorted
by rank) and never leaves a process behind.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import traceback
from typing import Any

from shardsmith.verify.contract import ContractRecorder
from shardsmith.verify.worker_contract import Arrivals, ContractInWorker


def rank_main(rank: int, spec: dict[str, Any], queue) -> None:
    """One simulated rank: build the loader, iterate, send back keys, contract and stats."""
    try:
        if "fork" in mp.get_all_start_methods():
            # a spawned child defaults to spawn; a torchrun rank (what we simulate) forks its workers
            mp.set_start_method("fork", force=True)
        import torch

        # torchrun runs each rank with OMP_NUM_THREADS=1; a rank with an intra-op pool beside its
        # own busy workers waits in pool barriers on every small reduction
        torch.set_num_threads(1)
        rec = ContractRecorder()
        arrivals = Arrivals()
        seen: list[str] = []
        limit = spec["batches"]
        if spec["kind"] == "wds":
            from shardsmith.loaders.wds import WdsLoader
            from shardsmith.loaders.wds_config import WdsLoaderConfig

            cfg = WdsLoaderConfig(**spec["config"], rank=rank, world_size=spec["world"])
            loader = WdsLoader(cfg)
            constants = set(cfg.files_map) | set(cfg.presets_map)  # the same value in every row
            mode = spec.get("contract_in", "rank")
            if mode != "rank":
                loader.dataset.batch_hook = ContractInWorker(loader.constants, constants, send=mode == "workers")
            for i, batch in enumerate(loader):
                if limit is not None and i >= limit:
                    break
                seen += [f"{s}/{k}" for s, k in zip(batch["__shard__"], batch["__key__"])]
                worker_rec, worker_sig = batch.pop("__contract__", None), batch.pop("__signature__", None)
                if worker_rec is None:
                    rec.add(batch, constants)
                    continue
                if worker_sig is not None:
                    arrivals.check(i, batch, worker_rec, worker_sig, constants)
                rec.merge(worker_rec)
            stats = json.loads(json.dumps(loader.stats, default=str))
        else:
            import itertools

            from shardsmith.loaders.zip import ZipLoaderConfig

            cfg = ZipLoaderConfig(**spec["config"], rank=rank, world_size=spec["world"])
            n = spec["zip_len"]
            mine = len(range(rank, n, spec["world"]))  # one epoch: positions rank, rank+world, ... < n
            want = mine if limit is None else min(mine, limit * cfg.batch_size)
            got = 0
            for batch in itertools.islice(iter(cfg.build()), -(-want // cfg.batch_size)):
                take = min(cfg.batch_size, want - got)
                batch = {k: v[:take] for k, v in batch.items()}
                seen += [str(int(i)) for i in batch["idx"]]
                rec.add(batch)
                got += take
            stats = {"samples": got}
        queue.put({"rank": rank, "seen": seen, "contract": rec, "stats": stats, "arrivals": arrivals.to_dict()})
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails the run
        queue.put({"rank": rank, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()})


def _rank_context():
    """``fork`` where the platform has it and this process has not initialised CUDA: a rank then
    starts with torch already imported (a spawned one imports it again); each rank is still a separate process with its own loader and workers, as under
    torchrun. ``spawn`` otherwise (CUDA cannot cross a fork)."""
    import sys

    torch = sys.modules.get("torch")
    cuda_live = torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized()
    if "fork" in mp.get_all_start_methods() and not cuda_live:
        return mp.get_context("fork")
    return mp.get_context("spawn")


class Ranks:
    """``world`` rank processes: started by the constructor, collected by :meth:`collect`,
    killed by :meth:`stop` if never collected."""

    def __init__(self, spec: dict[str, Any], world: int):
        ctx = _rank_context()
        self.queue = ctx.Queue()
        self.procs = [ctx.Process(target=rank_main, args=(r, spec, self.queue), daemon=False)
                      for r in range(world)]
        try:
            for p in self.procs:
                p.start()
        except BaseException:
            self.stop(grace=0)
            raise

    def collect(self, timeout: float) -> list[dict[str, Any]]:
        results = []
        try:
            for _ in self.procs:
                results.append(self.queue.get(timeout=timeout))
        finally:
            self.stop()
        return sorted(results, key=lambda r: r["rank"])

    def stop(self, grace: float = 10) -> None:
        for p in self.procs:
            if p.pid is None:
                continue
            p.join(timeout=grace)
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
