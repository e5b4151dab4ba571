"""The batch contract recorded in the loader's workers (``verify(contract_in="workers"|"workers-only")``).

- :class:`ContractInWorker` is the ``WdsDataset.batch_hook`` each worker runs on every collated
  batch: it folds the batch into a :class:`~shardsmith.verify.contract.ContractRecorder` and
  attaches that record (and, when the batch is sent on, its
  :func:`~shardsmith.verify.contract.batch_signature`).
- :class:`Arrivals` is the rank's side: every batch that reaches the rank must carry the keys,
  dtypes and shapes the worker collated; the first and every ``SPOT_CHECK_EVERY``-th are re-read
  in full at the rank and must give the worker's statistics exactly. Its ``to_dict()`` is the
  ``arrivals`` entry a rank reports.
"""

from __future__ import annotations

import json
from typing import Any

from shardsmith.verify.contract import ContractRecorder, batch_signature

# contract_in="workers": the rank re-reads in full its first batch and every this-many-th after it
SPOT_CHECK_EVERY = 16


class ContractInWorker:
    """``WdsDataset.batch_hook`` for ``verify(contract_in="workers"|"workers-only")``: the worker
    folds each collated batch (constants attached as views, as the rank sees them) into a
    :class:`ContractRecorder`. ``send=True`` ("workers"): the batch still goes to the rank, with
    that record and the batch's :func:`batch_signature` attached. ``send=False``
    ("workers-only"): only the sample ids and the record go."""

    def __init__(self, constants: dict[str, Any], constant_keys: set[str], send: bool = True):
        self.constants, self.constant_keys, self.send = constants, constant_keys, send
        # a batch that is not sent is not kept: collate into the same buffers each time
        self.reuses_batch = not send

    def __call__(self, batch: dict) -> dict:
        from shardsmith.loaders.collate import attach_constant_views

        full = attach_constant_views(dict(batch), self.constants)  # the batch itself is sent without them
        rec = ContractRecorder()
        rec.add(full, self.constant_keys)
        if self.send:
            batch["__contract__"], batch["__signature__"] = rec, batch_signature(full)
            return batch
        return {"__key__": batch["__key__"], "__shard__": batch["__shard__"], "__contract__": rec}


def _same_record(a: ContractRecorder, b: ContractRecorder) -> bool:
    """Two records of one batch agree exactly (NaN examples compare equal)."""
    return json.dumps(a.to_dict(), sort_keys=True, default=str) == json.dumps(b.to_dict(), sort_keys=True, default=str)


class Arrivals:
    """The rank's side of ``contract_in="workers"``: every batch that reaches the rank must have
    the keys, dtypes and shapes the worker recorded; the first and every ``SPOT_CHECK_EVERY``-th
    are re-read in full here and must give the worker's statistics exactly."""

    def __init__(self) -> None:
        self.batches = self.spot_checked = self.mismatched = 0
        self.mismatches: list[str] = []  # the first 20, described

    def check(self, i: int, batch: dict, worker_rec: ContractRecorder, worker_sig: dict, constants: set[str]) -> None:
        self.batches += 1
        where = f"batch {i} ({batch['__shard__'][0]}/{batch['__key__'][0]} ...)"
        sig = batch_signature(batch)
        if sig != worker_sig:
            diff = sorted(k for k in set(sig) | set(worker_sig) if sig.get(k) != worker_sig.get(k))
            self._mismatch(f"{where}: the rank got {[sig.get(k) for k in diff]} for {diff}, the worker "
                           f"collated {[worker_sig.get(k) for k in diff]}")
        elif i % SPOT_CHECK_EVERY == 0:
            self.spot_checked += 1
            mine = ContractRecorder()
            mine.add(batch, constants)
            if not _same_record(mine, worker_rec):
                self._mismatch(f"{where}: the values the rank got differ from those the worker recorded")

    def _mismatch(self, what: str) -> None:
        self.mismatched += 1
        if len(self.mismatches) < 20:
            self.mismatches.append(what)

    def to_dict(self) -> dict[str, Any]:
        return {"batches": self.batches, "spot_checked": self.spot_checked, "mismatched": self.mismatched,
                "mismatches": self.mismatches}
