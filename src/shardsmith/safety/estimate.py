"""How many bytes a planned build still has to write, from its ledger, before it writes them.

Why from the ledger: the plan already probed every item once; this estimate reads no item a
second time except a small deterministic sample (``SAMPLE`` per output, spread over plan order)
that is transformed and encoded with the output's own sample maker, as ``scan`` does, and
scaled with :func:`scale_sample` (scan's too) to the output's planned counts.

Contract
- :func:`sample_items` picks at most ``k`` planned ``ok`` items of ``sources``, spread over plan
  order, with one indexed query each (no scan of every row in Python).
- :func:`sample_bytes`, :func:`output_bytes` and :func:`scale_sample` are pure: the bytes one
  sample adds to an image output, the output's bytes for given counts and sample size, and
  both scaled from a sample to planned counts.
- :func:`output_estimate` is pure: the bytes an image output occupies once complete (a ZIP
  twice: its staged units stay beside it), minus what committed units already hold.
- Latent outputs are not estimated (their sizes depend on the model): ``bytes`` is None; nor is
  an output given no sample to scale (a ``prompt_wds`` with a text encoder).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shardsmith import formats
from shardsmith.plan.ledger import Ledger
from shardsmith.recipe import PromptWdsOutput, VideoWdsOutput, WdsOutput, ZipOutput
from shardsmith.records import PlannedItem
from shardsmith.formats.wds import sample_tar_bytes

SAMPLE = 16
#: outputs of WebDataset shards whose samples their maker makes whole (estimated like ``wds``)
SHARD_OUTPUTS = (WdsOutput, PromptWdsOutput, VideoWdsOutput)

#: bytes a stored ZIP member costs beyond its data: local header (30) + central entry (46) + name twice
ZIP_MEMBER_OVERHEAD = 30 + 46 + 2 * len(formats.zip_member_name(0))
#: tar end-of-archive (2 blocks) plus, on average, half a 10 KiB record of padding per shard
TAR_SHARD_OVERHEAD = 2 * formats.tar.BLOCK + 10 * formats.tar.BLOCK


@dataclass(frozen=True)
class OutputEstimate:
    name: str
    total: int | None  # bytes of the complete output (None: not estimated)
    committed: int  # bytes the committed units already hold

    @property
    def needed(self) -> int | None:
        return None if self.total is None else max(0, self.total - self.committed)

    def describe(self) -> str:
        if self.total is None:
            return f"output {self.name}: not estimated (latent sizes depend on the model)"
        from shardsmith.scan import human_bytes

        return (f"output {self.name}: about {human_bytes(self.total)} in all, {human_bytes(self.committed)} "
                f"already written, {human_bytes(self.needed)} to go")


def sample_items(ledger: Ledger, sources: list[int], k: int = SAMPLE) -> list[PlannedItem]:
    """At most ``k`` planned ``ok`` items of ``sources``, spread over plan order (deterministic)."""
    top = ledger.count_items()
    picked: dict[int, PlannedItem] = {}
    for i in range(k):
        lo = i * top // k
        it = next(ledger.items(status="ok", sources=sources, idx_range=(lo, top)), None)
        if it is not None:
            picked[it.idx] = it
    return [picked[i] for i in sorted(picked)]


def sample_bytes(o: WdsOutput | ZipOutput, members: dict[str, bytes], key: str) -> int:
    """Bytes one written sample adds to output ``o`` (its tar members, or its ZIP member)."""
    if isinstance(o, SHARD_OUTPUTS):
        return sample_tar_bytes(members, key)
    return len(members["png"]) + ZIP_MEMBER_OVERHEAD


def output_bytes(o: WdsOutput | ZipOutput, counts: tuple[int, int], per_sample: float, *,
                 empty_splits: bool) -> float:
    """Bytes on disk of output ``o`` once it holds ``counts`` = (train, holdout) samples of
    ``per_sample`` bytes each (a tar's member bytes, or a ZIP member's data + its headers), with
    the container and index files; ``empty_splits``: a ZIP is written for a split with no image."""
    total = sum(counts) * per_sample
    if isinstance(o, SHARD_OUTPUTS):
        for k in counts:
            if k:
                shards = math.ceil(k / o.samples_per_shard)
                if o.max_shard_bytes:
                    shards = max(shards, math.ceil(k * per_sample / o.max_shard_bytes))
                total += shards * TAR_SHARD_OVERHEAD + 20 * (shards + 1)  # + shard_count.json
    else:
        for k in counts:
            if k or empty_splits:
                # dataset.json rows ["00000/img00000000.png", 12], plus the end-of-central-directory record
                label_bytes = (len(formats.zip_member_name(0)) + 10) * k + 20
                total += label_bytes + ZIP_MEMBER_OVERHEAD + len(formats.ZIP_LABELS_FILE) + 22
    return total


@dataclass(frozen=True)
class Scaled:
    samples: tuple[int, int]  # (train, holdout) samples expected to be written
    per_sample: float  # mean bytes of a written sample
    total: float  # bytes of the complete output


def scale_sample(o: WdsOutput | ZipOutput, counts: tuple[int, int], sample_sizes: list[int | None]) -> Scaled:
    """``counts``: the (train, holdout) items the output will try to write; ``sample_sizes``:
    bytes of each sampled item's sample (None where it would not be written). The written share
    and mean size of the sample, applied to ``counts``."""
    sizes = [n for n in sample_sizes if n is not None]
    frac = len(sizes) / len(sample_sizes) if sample_sizes else 0.0
    per = sum(sizes) / len(sizes) if sizes else 0.0
    est = (round(counts[0] * frac), round(counts[1] * frac))
    return Scaled(est, per, output_bytes(o, est, per, empty_splits=sum(counts) > 0))


def output_estimate(o, counts: tuple[int, int], sample_sizes: list[int | None], committed: int) -> OutputEstimate:
    """``counts``: the planned (train, holdout) items the output will try to write;
    ``sample_sizes``: bytes of each sampled item's sample (None where it would not be written)."""
    if not isinstance(o, (*SHARD_OUTPUTS, ZipOutput)) or (sum(counts) and not sample_sizes):
        return OutputEstimate(o.name, None, committed)  # (no sample made: members made by an encoder)
    total = scale_sample(o, counts, sample_sizes).total
    if isinstance(o, ZipOutput):
        total *= 2  # the staged units (.shardsmith/stage) and the ZIP assembled from them
    return OutputEstimate(o.name, round(total), committed)
