"""Turn encoded latents and text embeddings into the members each latent output writes.

``LatentFinisher`` sits between the workers (bucketed pixels) and a sink: ``add`` queues a
result in its bucket and encodes a batch as soon as one is full (so host memory holds at most
one batch of pixels per bucket); ``flush`` encodes what is left before a unit is written.
Batches are formed in plan order, so a resumed run encodes exactly the same batches.

Members
- ``latent_wds``: ``latent.pth`` (``[C, (F'), H', W']``), ``txt_emb.pth`` (``[L, D]``), ``json``
  (source, bucket, fps, crop, models) and, with ``include_media``, the source bytes under
  their own extension.
- ``precomputed``: ``latents/<mirrored path>.pt`` and ``conditions/<mirrored path>.pt`` as
  reference/ltx-trainer.md §2.5 describes.
"""

from __future__ import annotations

import functools
import io
import json
import os
import time
from concurrent.futures import wait

import numpy as np
import torch

from shardsmith import formats
from shardsmith.encode.host_threads import one_intra_op_thread
from shardsmith.recipe import LatentWdsOutput
from shardsmith.records import PlannedItem, SampleResult, SourceInfo
from shardsmith.sinks.atomic import atomic_write_bytes
from shardsmith.sinks.precomputed import CONDITIONS, LATENTS, condition_record, latent_record, mirrored, pt_bytes
from shardsmith.sinks.pt_write import pt_bytes_rows

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class LatentFinisher:
    """Queues results per bucket; full batches are encoded on one background thread (the GPU works
    while the main thread keeps taking results from the decode workers and serialising finished
    batches).

    Units (output shards) pipeline: :meth:`seal` submits a unit's last, partial batches and
    returns at once, so the encoder goes on with the next unit's batches while the caller waits
    for :meth:`ready` before writing the sealed one (:meth:`finish_through` blocks until it is).
    Batches never mix units, so a resumed run encodes exactly the same batches.

    At most ``max_in_flight`` batches wait for the encoder, which bounds host memory: 2 on a CPU;
    4 on a GPU, where a batch is launched ahead and the queue absorbs the host's jitter (a shard
    write, a slow decode, the encoder thread waiting for the interpreter lock between its kernel
    launches) so that the device does not run dry.
    """

    MAX_IN_FLIGHT = {"cpu": 2, "cuda": 4}
    WRITER_THREADS = 2  # bench/shard_write.py: 6 text shards in 0.79x the time of one thread (CPU machine, BENCHMARKS §5)

    def __init__(self, output, stage, sources: list[SourceInfo], multi_source: bool):
        """``stage``: the :class:`~shardsmith.encode.stage.EncodeStage`, or a function giving it,
        called at the first batch (the models may still be loading while the first items decode)."""
        from concurrent.futures import ThreadPoolExecutor

        self.o, self.sources, self.multi = output, sources, multi_source
        self._get_stage = stage if callable(stage) else (lambda: stage)
        self._stage = None
        self._expected: int | None = None  # items this finisher will encode, when known (expect())
        self.pending: dict[str, list[tuple[PlannedItem, SampleResult, int]]] = {}  # per bucket, with unit tags
        # the build writes finished units here (file writes, hashing and fsync release the GIL); two
        # threads, so that one unit's write overlaps the other's fsync (the build still records units
        # in order, and at most MAX_WRITING_UNITS + 1 are being written)
        self.writer = ThreadPoolExecutor(max_workers=self.WRITER_THREADS, thread_name_prefix="shardsmith-write")
        self.in_flight: list = []  # (first unit tag in the batch, batch, future), in submission order
        self.unit = 0  # tag of the unit now being filled

    @property
    def stage(self):
        """The encode stage (got on first use, in the calling thread: the build's main thread)."""
        if self._stage is None:
            st = self._get_stage()
            self.max_in_flight = self.MAX_IN_FLIGHT.get(st.device, 2)
            self.models = {k: {"family": v["spec"]["family"], "weights": v["provenance"]["weights"],
                               "path_or_repo": v["provenance"].get("path_or_repo")}
                           for k, v in st.describe().items() if k in ("vae", "text")}
            self._base = st.launched  # this finisher's items are those launched from here on
            self._stage = st
            if self._expected is not None:
                st.expect(self._expected, since=self._base)
        return self._stage

    def expect(self, items: int) -> None:
        """This finisher will encode ``items`` items in all (``models.compile=auto`` weighs the
        rest); may come late (a plan running ahead) and before the stage is loaded."""
        self._expected = items
        if self._stage is not None:
            self._stage.expect(items, since=self._base)

    def _submit(self, entries: list[tuple[PlannedItem, SampleResult, int]]) -> None:
        # stage (stack + page-lock) here, while the encoder thread still runs the previous batch
        stage = self.stage
        batch = [(item, res) for item, res, _ in entries]
        host = stage.stage([r.pixels for _, r in batch])
        for _, r in batch:
            r.pixels = None
        # on the stage's device thread (where the warm-up tuned cuDNN), queued behind earlier batches
        self.in_flight.append((entries[0][2], batch, stage.submit(self._gpu, stage, batch, host,
                                                                  time.perf_counter())))
        while len(self.in_flight) > self.max_in_flight:
            self._finish(self.in_flight.pop(0))

    @staticmethod
    def _gpu(stage, batch: list[tuple[PlannedItem, SampleResult]], host, staged_at: float):
        """Encoder thread: start the model work (staged pixels -> latents, captions -> embeddings);
        on a GPU it returns once the batch is queued there, so the next batch is queued behind it."""
        captions = [it.caption or "" for it, _ in batch] if stage.text_encoder else None
        return stage.launch(host, len(batch), captions, staged_at=staged_at)

    def _finish(self, entry) -> None:
        """Calling thread: wait for the batch, serialise members (re-raises an encoder error here).
        Its host copies (dtype, text embeddings) run on one intra-op thread: the decode workers hold
        the cores, and a parallel copy would wait at barriers for threads they leave no room for."""
        _tag, batch, fut = entry
        with one_intra_op_thread():
            self._members(batch, *fut.result().result_batch())

    def _members(self, batch: list[tuple[PlannedItem, SampleResult]], z: torch.Tensor, texts) -> None:
        z = z.to(_DTYPES[self.o.latent_dtype]).contiguous()  # the whole batch at once
        if isinstance(self.o, LatentWdsOutput):
            # each item's latent.pth rendered straight from the batch, no tensor per item
            latents = pt_bytes_rows(z)
            shape = tuple(z.shape[1:])
        else:
            latents = [t.clone() for t in z.unbind(0)]
        for i, (item, res) in enumerate(batch):
            text = texts[i] if texts else None
            if isinstance(self.o, LatentWdsOutput):
                res.members = self._wds_members(item, res, latents[i], shape, text)
            else:
                res.members = self._precomputed_members(item, res, latents[i], text)
            res.pixels = None

    def add(self, item: PlannedItem, res: SampleResult) -> None:
        q = self.pending.setdefault(res.info["bucket"], [])
        q.append((item, res, self.unit))
        if len(q) >= self.stage.batch_size:
            self._submit(list(q))
            q.clear()

    def seal(self) -> int:
        """End the current unit; returns its tag. Where the stage pads short batches (a GPU: an
        item's result does not depend on its batch-mates), the unit's last items wait for the next
        unit's first ones to fill a batch: a shard of 1000 samples in batches of 64 would otherwise
        send 40 items padded to 64 once per shard (2.4 % of the device's work). Elsewhere a short
        batch goes now, so batches never straddle units and a resumed build makes the same batches."""
        if not self.stage.pads():
            self._submit_pending(self.unit)
        tag, self.unit = self.unit, self.unit + 1
        return tag

    def _queued_through(self, tag: int) -> list[list]:
        """The buckets' queues (short of a batch) that hold items of units up to ``tag``."""
        return [q for q in self.pending.values() if q and q[0][2] <= tag]

    def _submit_pending(self, tag: int) -> None:
        """Submit every queue that holds items of units up to ``tag``, as a short batch."""
        for q in self._queued_through(tag):
            self._submit(list(q))
            q.clear()

    def ready(self, tag: int) -> bool:
        """True when every item of units up to ``tag`` has been encoded (not yet serialised)."""
        if self._queued_through(tag):
            return False  # still queued for a batch that is not full
        return all(fut.done() and (fut.exception() is not None or fut.result().done())
                   for t, _, fut in self.in_flight if t <= tag)

    def finish_through(self, tag: int) -> None:
        """Encode (short batches too) and serialise the members of every item of units up to ``tag``;
        batches that also hold later units' items are finished whole."""
        self._submit_pending(tag)
        # in order; a batch of another bucket submitted later may hold an older unit
        due = [e for e in self.in_flight if e[0] <= tag]
        self.in_flight = [e for e in self.in_flight if e[0] > tag]
        for entry in due:
            self._finish(entry)

    def flush(self) -> None:
        """Encode every queued item (partial batches too) and wait until all members exist."""
        self.finish_through(self.seal())

    def close(self) -> None:
        """Wait for this finisher's batches on the device thread and for units being written (a file
        is never left half-written)."""
        wait([fut for _, _, fut in self.in_flight])
        self.writer.shutdown(wait=True)

    def _wds_members(self, item: PlannedItem, res: SampleResult, latent: bytes, shape: tuple[int, ...],
                     text) -> dict[str, bytes]:
        """A ``latent_wds`` sample's members: ``latent`` is its ``latent.pth`` bytes already."""
        out = {"latent.pth": latent}
        if text is not None:
            out["txt_emb.pth"] = pt_bytes(text[0].to(_DTYPES[self.o.text_dtype]).contiguous())
        out["json"] = self._json(item, res, shape)
        if self.o.include_media:
            with open(item.path, "rb") as f:
                out[_media_suffix(item.path)] = f.read()
        return out

    def _precomputed_members(self, item: PlannedItem, res: SampleResult, z: torch.Tensor, text) -> dict[str, bytes]:
        rel = mirrored(item.relpath, self.sources[item.source].name if self.multi else None)
        out = {f"{LATENTS}/{rel}": pt_bytes(latent_record(z, res.info["fps"]))}
        if text is not None:
            out[f"{CONDITIONS}/{rel}"] = pt_bytes(condition_record(text[0].to(_DTYPES[self.o.text_dtype]), text[1]))
        return out

    def _json(self, item: PlannedItem, res: SampleResult, latent_shape: tuple[int, ...]) -> bytes:
        src = self.sources[item.source]
        meta = {"id": item.item_id, "source": src.name, "path": item.relpath, "sha256": item.sha256,
                "caption": item.caption, "label": item.label, "license": src.license, "origin": src.origin,
                "latent_shape": list(latent_shape), "models": self.models, **res.info}
        return json.dumps(meta, sort_keys=True, ensure_ascii=False).encode("utf-8")

    def member_sizes(self, item: PlannedItem, res: SampleResult) -> list[tuple[str, int]]:
        """``(suffix, bytes)`` of the members a ``latent_wds`` sample will have, exactly, before it
        is encoded (a ``.pth`` member's length depends on shape and dtype only): shards bounded
        by bytes close at the same samples on every run."""
        st = self.stage
        frames = res.pixels.shape  # [F, H, W, 3]
        pixel = (3, *frames[1:3]) if st.vae.spec.kind == "image_vae" else (3, *frames[:3])
        shape = st.vae.spec.latent_shape(pixel)
        out = [("latent.pth", _pth_size(shape, self.o.latent_dtype))]
        if st.text_encoder is not None:
            ts = st.text_encoder.spec
            out.append(("txt_emb.pth", _pth_size((ts.max_length, ts.dim), self.o.text_dtype)))
        out.append(("json", len(self._json(item, res, shape))))
        if self.o.include_media:
            out.append((_media_suffix(item.path), os.path.getsize(item.path)))
        return out


def _media_suffix(path: str) -> str:
    ext = os.path.splitext(path)[1].lower().lstrip(".") or "bin"
    return "jpg" if ext == "jpeg" else ext


@functools.lru_cache(maxsize=64)
def _pth_size(shape: tuple[int, ...], dtype: str) -> int:
    """Bytes of ``torch.save`` of a contiguous tensor of ``shape`` and ``dtype`` (values do not change it)."""
    return len(pt_bytes(torch.zeros(shape, dtype=_DTYPES[dtype])))


NEG_PROMPT_FILE = formats.NEG_PROMPT_FILE


def write_negative_prompt(path, stage, prompt: str) -> None:
    """The constant for FastGen's ``files_map``: float32 ``[L, D]`` ``.npy`` (no pickle), atomically."""
    emb, _ = stage.text([prompt])[0]
    buf = io.BytesIO()
    np.save(buf, emb.to(torch.float32).numpy(), allow_pickle=False)
    atomic_write_bytes(path, buf.getvalue())
