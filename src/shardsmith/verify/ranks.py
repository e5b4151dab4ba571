"""``verify``'s simulated ranks: ``world`` processes, each building the real loader (with its own
workers) for its rank and iterating it, as under torchrun.

A rank gets a JSON-able ``spec`` (``kind`` ``"wds"`` or ``"zip"``, the loader ``config`` without
rank and world size, ``world``, ``batches`` per rank or None for a full pass, ``contract_in`` or
``zip_len``, ``expected``: :meth:`~shardsmith.verify.expected.ExpectedWds.to_spec` or
:meth:`~shardsmith.verify.expected.ExpectedRange.to_spec`, ``seen_dir``: a folder) and writes what it
saw, in order, to the seen log ``<seen_dir>/rank<r>`` (``verify.seen_log``: expected positions, ids
only for samples no full pass yields), then puts one result on the queue: ``{"rank", "seen"
(the log's base path), "seen_count", "contract" (a ContractRecorder), "stats", "arrivals"}``, or
``{"rank", "error", "trace"}`` when anything raised; while it runs, ``{"rank", "progress": n}`` (n more samples seen)
every ``PROGRESS_EVERY_S`` seconds. :class:`Ranks` starts them, collects one result per rank (sorted
by rank; progress messages advance the caller's progress bar) and never leaves a process behind.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import time
import traceback
from typing import Any

from shardsmith.verify.contract import ContractRecorder
from shardsmith.verify.expected import ExpectedWds, Locator, expected_from_spec
from shardsmith.verify.seen_log import SeenWriter
from shardsmith.verify.worker_contract import Arrivals, ContractInWorker

PROGRESS_EVERY_S = 0.25


def rank_main(rank: int, spec: dict[str, Any], queue) -> None:
    """One simulated rank: build the loader, iterate, log what it saw, send back contract and stats."""
    seen = None
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
        expected = expected_from_spec(spec["expected"])
        seen = _Seen(rank, queue, f"{spec['seen_dir']}/rank{rank}", expected)
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
                seen.add_wds(batch["__shard__"], batch["__key__"])
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
                seen.add_indices(batch["idx"])
                rec.add(batch)
                got += take
            stats = {"samples": got}
        seen.close()
        queue.put({"rank": rank, "seen": str(seen.log.base), "seen_count": seen.log.count, "contract": rec,
                   "stats": stats, "arrivals": arrivals.to_dict()})
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails the run
        if seen is not None:
            seen.close()
        queue.put({"rank": rank, "error": error_line(exc), "trace": traceback.format_exc()})


def error_line(exc: BaseException) -> str:
    """``Type: message`` of a rank's error on one line. A DataLoader worker's error arrives as ``Caught X in
    DataLoader worker process N.`` followed by the worker's traceback: it becomes that first sentence and the
    traceback's last line (the original error); the traceback itself stays in the report's ``traces``."""
    text = str(exc)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if "Original Traceback (most recent call last):" in text and len(lines) > 2:
        return f"{type(exc).__name__}: {lines[0]} {lines[-1]}"
    return f"{type(exc).__name__}: {' '.join(lines)}"


class _Seen:
    """The samples a rank saw, written to its seen log (``verify.seen_log``) as expected positions
    (``Locator`` for WebDataset ids ``shard/key``, the index itself for a ZIP); every
    ``PROGRESS_EVERY_S`` seconds the rank also puts ``{"rank", "progress": n}`` (samples since the
    last one) on the queue, for the parent's progress bar."""

    def __init__(self, rank: int, queue, base: str, expected):
        self.rank, self.queue, self.last, self.sent = rank, queue, time.monotonic(), 0
        self.log = SeenWriter(base)
        self.expected = expected
        self.locate = Locator(expected) if isinstance(expected, ExpectedWds) else None
        self.closed = False

    def add_wds(self, shards, keys) -> None:
        for s, k in zip(shards, keys):
            self.log.add(self.locate.position(s, k), f"{s}/{k}")
        self._progress()

    def add_indices(self, indices) -> None:
        n = len(self.expected)
        for i in indices:
            i = int(i)
            self.log.add(i if 0 <= i < n else None, str(i))
        self._progress()

    def _progress(self) -> None:
        now = time.monotonic()
        if now - self.last >= PROGRESS_EVERY_S:
            self.queue.put({"rank": self.rank, "progress": self.log.count - self.sent})
            self.last, self.sent = now, self.log.count

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.log.close()


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

    def collect(self, timeout: float, tick=None) -> list[dict[str, Any]]:
        """Every rank's result; ``tick.advance(n)`` for each progress message (samples seen)."""
        results, told = [], {}
        try:
            while len(results) < len(self.procs):
                msg = self.queue.get(timeout=timeout)
                if "progress" in msg:
                    told[msg["rank"]] = told.get(msg["rank"], 0) + msg["progress"]
                    if tick is not None:
                        tick.advance(msg["progress"])
                    continue
                if tick is not None and "seen" in msg:  # the rest of what this rank saw
                    tick.advance(msg["seen_count"] - told.get(msg["rank"], 0))
                results.append(msg)
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
