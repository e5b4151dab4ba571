"""Schedules the encoder for a latent output: results from the decode workers are queued per
bucket and go to the encode stage's device thread in batches, and each finished batch is handed to
the output's member renderer.

Contract
- ``add(item, res)`` queues a result in its bucket and submits a batch as soon as one is full
  (host memory holds at most one batch of pixels per bucket); batches are formed in plan order,
  so a resumed run encodes exactly the same batches.
- ``seal()`` ends a unit and returns its tag; ``ready(tag)`` says whether every item of units up
  to ``tag`` is encoded; ``finish_through(tag)`` makes sure each of them has its members
  (``res.members``, rendered by ``members.render(batch, latents, texts)`` on the calling thread,
  on one intra-op thread); ``flush()`` does so for everything queued; ``close()`` waits for the
  device thread's batches and for the units being written on ``writer``.
- ``member_sizes(item, res)``: the exact sizes of an item's members before it is encoded.
- With a ``memo`` (:class:`~shardsmith.encode.memo.EncodedMemo`: several outputs need the same
  encoders), an item the memo holds is rendered at ``add`` from the kept results and never sent to
  the encoder; every batch encoded here is put in the memo.
- A result without pixels (``res.pixels`` None: a ``prompt_wds`` sample, a caption and nothing to
  encode with the VAE) is queued apart from the buckets; its batches run only the text encoder,
  through the stage's caption cache (``stage.launch_text``: started on the device thread, waited for
  when the batch is serialised; ``stage.text`` where a teacher takes them at once), and are rendered with
  ``z`` None. They are not put in the memo (it keeps latents); the caption cache already encodes a
  caption once. Batches with pixels go exactly as before. Audio-only results queue by their audio's
  rate and length (:func:`queue_of`).
- Audio: a result with ``res.audio`` (a :class:`~shardsmith.records.Waveform`) has it stacked
  (``stage.stage_audio``) into page-locked memory on a staging thread of its own on a GPU, in order, so the
  device thread only launches (off a GPU: stacked on the device thread; the calling thread, which feeds the
  device and serialises, is the build's busiest), started on the device thread by the stage's audio encoder with its batch
  (after the batch's VAE launch) and waited for when the batch is serialised (``stage.audio_result``), and the
  renderer gets ``audio=`` one latent per item (None for an item without audio); a batch without any
  audio is rendered as before (no ``audio`` argument). An audio-only item has no pixels: it goes in
  the queue without pixels, whose batches then run the audio encoder too.
- Partners (``res.partners``: a reference, a source, the first frame; issue 18) are encoded by the
  VAE on the device thread after their batch's launch, grouped by name and shape, and reach the
  renderer as ``partners={name: latent per item}``. Items with partners bypass the memo.
- Teacher (``shardsmith distill``): with ``stage.teacher``, a batch without pixels is also sampled by
  the teacher on the device thread (``stage.trajectories``, its items' ids giving the seeds), and a
  renderer with ``takes_teacher`` gets ``teacher=`` one trajectory per item.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any, Protocol

import torch

from shardsmith.encode.host_threads import one_intra_op_thread
from shardsmith.encode.pending import PendingBatch
from shardsmith.records import PlannedItem, SampleResult

if TYPE_CHECKING:
    from shardsmith.encode.audio_vae import LaunchedAudio


def geometry(res: SampleResult) -> str:
    """What decided an item's pixels (its bucket and crop): the memo shares an encoded item only
    between outputs that cut it alike."""
    return json.dumps([res.info.get("bucket"), res.info.get("crop")], sort_keys=True)


TEXT_ONLY = "text-only"  # the queue of results without pixels (never a bucket's name, WxHxF)


def queue_of(res: SampleResult) -> str:
    """The queue an encoder result waits in for its batch: its pixel bucket; without pixels, its
    audio's rate and length (``audio:<rate>:<samples>``: every batch of an audio-only dataset has one
    shape and one rate to resample from, so the encoder meets few shapes and never splits a batch), else
    :data:`TEXT_ONLY`."""
    if res.pixels is not None:
        return res.info["bucket"]
    if res.teacher is not None:  # shardsmith distill: one sample shape a batch
        return f"teacher:{'x'.join(map(str, res.teacher.shape))}"
    if res.audio is not None:
        return f"audio:{res.audio.rate}:{res.audio.samples.shape[-1]}"
    return TEXT_ONLY


class TextOnlyBatch:
    """The finished result of a batch without pixels, read like a launched batch's
    (:class:`~shardsmith.encode.pending.PendingBatch`): no latents, ``(emb [L, D], mask [L])`` per item
    (None without a text encoder; a PendingBatch while they are still on the device), and ``audio``:
    the batch's launched audio (:class:`~shardsmith.encode.audio_vae.LaunchedAudio`, None without audio)."""

    def __init__(self, texts: "list[tuple[torch.Tensor, torch.Tensor]] | PendingBatch | None",
                 audio: list | None = None, audio_reference: list | None = None, teacher: list | None = None):
        self.texts, self.audio, self.audio_reference = texts, audio, audio_reference
        self.teacher = teacher  # the teacher's trajectories, one per item (shardsmith distill)

    def done(self) -> bool:
        return (not isinstance(self.texts, PendingBatch) or self.texts.done()) and all(
            a is None or a.done() for a in (self.audio, self.audio_reference))

    def result_batch(self) -> tuple[None, list[tuple[torch.Tensor, torch.Tensor]] | None]:
        """Waits for text embeddings still on the device (:meth:`EncodeStage.launch_text`)."""
        if isinstance(self.texts, PendingBatch):
            self.texts = self.texts.result_batch()[1]
        return None, self.texts


def _take(batch: list[tuple[PlannedItem, SampleResult]], attr: str) -> list | None:
    """The batch's results' ``attr`` (one per item; each result's is cleared: the device thread owns it
    now), or None when no item has one."""
    values = [getattr(res, attr) for _, res in batch]
    for _, res in batch:
        setattr(res, attr, None)
    return None if all(v is None for v in values) else values


def _partner_latents(stage, partners: list | None) -> dict[str, list] | None:
    """Encoder thread: ``{name: one latent per item of the batch (None where the item has no such
    partner)}`` of the batch's partners, each name's pixels of one shape encoded together by the VAE."""
    if partners is None:
        return None
    out: dict[str, list] = {}
    for name in sorted({n for p in partners if p for n in p}):
        by_shape: dict[tuple, list[int]] = {}
        for i, p in enumerate(partners):
            if p and name in p:
                by_shape.setdefault(p[name].shape, []).append(i)
        got: list = [None] * len(partners)
        for rows in by_shape.values():
            for i, z in zip(rows, stage.latents([partners[i][name] for i in rows])):
                got[i] = z
        out[name] = got
    return out


def _audio_latents(stage, waves: list | None, handed_at: float | None) -> "LaunchedAudio | None":
    """Encoder thread: a batch's waveforms (one per item, None where it has none; ``waves`` None: no item
    has audio; or a future of them already stacked, :meth:`LatentFinisher._staged`) stacked
    (:meth:`EncodeStage.stage_audio`) and started on the device; the calling thread takes one latent per
    item (None where the item has no audio) with :func:`_audio_out` when it serialises the batch. The GPU's
    idle gaps are judged against ``staged_at``: for waveforms stacked on the staging thread, when that
    stacking ended (so a late one shows as ``pixels``, not as a late launch); else ``handed_at``, when the
    calling thread submitted the batch (the stacking is then the encoder thread's own work), or when it
    was stacked where ``handed_at`` is None."""
    if isinstance(waves, Future):  # stacked ahead on the staging thread (LatentFinisher._staged)
        staged = waves.result()
        handed_at = None
    else:
        staged = None if waves is None else stage.stage_audio(waves)
    if staged is None:
        return None
    if handed_at is not None:
        staged.staged_at = handed_at
    return stage.launch_audio(staged)


def _audio_out(stage, launched) -> list | None:
    """Calling thread: the latents of a batch's launched audio (see :func:`_audio_latents`)."""
    return None if launched is None else stage.audio_result(launched)


def _drop_failed(batch, failed: dict, z, texts, audio, partners, ref_audio):
    """The batch without its ``failed`` rows (``{row: ItemError}``), whose results become failures."""
    for row, err in failed.items():
        if row < len(batch):
            res = batch[row][1]
            res.status, res.detail, res.members = err.status, err.detail, None
    keep = [i for i in range(len(batch)) if i not in failed]

    def rows(v):
        return None if v is None else [v[i] for i in keep]

    z = None if z is None else z[keep]
    partners = None if partners is None else {k: rows(v) for k, v in partners.items()}
    return [batch[i] for i in keep], z, rows(texts), rows(audio), partners, rows(ref_audio)


class MemberRenderer(Protocol):
    """What turns a finished batch into its samples' members (``res.members``), e.g.
    :class:`~shardsmith.sinks.latent_members.LatentMembers`."""

    def start(self, stage: Any) -> None:
        """Called once, with the encode stage, before the first batch is submitted."""

    def render(self, batch: list[tuple[PlannedItem, SampleResult]], z: torch.Tensor, texts) -> None:
        """Set ``res.members`` of every item of a finished batch (``z``: its latents, ``[n, ...]``,
        None for a batch without pixels; ``texts``: ``(emb, mask)`` per item, or None). A renderer
        with ``takes_audio`` also takes ``audio=`` / ``audio_reference=`` (one ``[C, T, F]`` latent per
        item, or None) and ``partners=`` (``{name: latent per item}``), each only when the batch has it."""

    def sizes(self, item: PlannedItem, res: SampleResult, stage: Any) -> list[tuple[str, int]]:
        """``(suffix, bytes)`` of the members ``item`` will have, exactly, before it is encoded."""


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
    WRITER_THREADS = 2  # bench/shard_write.py (BENCHMARKS.md §5, shard writes)

    def __init__(self, members: MemberRenderer, stage, memo=None):
        """``members``: renders each finished batch's members. ``stage``: the
        :class:`~shardsmith.encode.stage.EncodeStage`, or a function giving it, called at the first
        batch (the models may still be loading while the first items decode)."""
        self.members = members
        self.memo = memo
        self._get_stage = stage if callable(stage) else (lambda: stage)
        self._stage = None
        self.pending: dict[str, list[tuple[PlannedItem, SampleResult, int]]] = {}  # per bucket, with unit tags
        # the build writes finished units here (file writes, hashing and fsync release the GIL); two
        # threads, so that one unit's write overlaps the other's fsync (the build still records units
        # in order; how many may queue here: distribute.local's WRITING_BYTES and MAX_QUEUED_UNITS)
        self.writer = ThreadPoolExecutor(max_workers=self.WRITER_THREADS, thread_name_prefix="shardsmith-write")
        # a GPU's batches of waveforms are stacked into page-locked memory here, in order, ahead of the
        # device thread, which then only launches them (made at the first such batch)
        self._stager: ThreadPoolExecutor | None = None
        self.in_flight: list = []  # (first unit tag in the batch, batch, future), in submission order
        self.unit = 0  # tag of the unit now being filled

    @property
    def stage(self):
        """The encode stage (got on first use, in the calling thread: the build's main thread)."""
        if self._stage is None:
            st = self._get_stage()
            self.max_in_flight = self.MAX_IN_FLIGHT.get(st.device, 2)
            self.members.start(st)
            self._stage = st
        return self._stage

    def _submit(self, entries: list[tuple[PlannedItem, SampleResult, int]]) -> None:
        # pixels staged (stack + page-lock) here, while the encoder thread still runs the previous batch; waveforms
        # on the encoder thread (_audio_latents)
        stage = self.stage
        batch = [(item, res) for item, res, _ in entries]
        waves, partners, ref_waves, teach = (_take(batch, a) for a in ("audio", "partners", "audio_reference",
                                                                        "teacher"))
        waves, ref_waves = self._staged(stage, waves), self._staged(stage, ref_waves)
        if batch[0][1].pixels is None:  # no pixels (the TEXT_ONLY queue): the text (and audio) encoder alone
            self.in_flight.append((entries[0][2], batch, stage.submit(self._text_only, stage, batch, waves,
                                                                      ref_waves, teach, time.perf_counter())))
            while len(self.in_flight) > self.max_in_flight:
                self._finish(self.in_flight.pop(0))
            return
        host = stage.stage([r.pixels for _, r in batch])
        for _, r in batch:
            r.pixels = None
        # on the stage's device thread (where the warm-up tuned cuDNN), queued behind earlier batches
        self.in_flight.append((entries[0][2], batch, stage.submit(self._gpu, stage, batch, host,
                                                                  time.perf_counter(), waves, partners,
                                                                  ref_waves)))
        while len(self.in_flight) > self.max_in_flight:
            self._finish(self.in_flight.pop(0))

    def _staged(self, stage, waves: list | None):
        """On a GPU: a future of the batch's waveforms stacked into page-locked memory on the staging thread
        (:func:`_audio_latents` takes it on the device thread); elsewhere, or without waveforms, ``waves``."""
        if waves is None or stage.device != "cuda":
            return waves
        if self._stager is None:
            self._stager = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shardsmith-stage")
        return self._stager.submit(stage.stage_audio, waves)

    @staticmethod
    def _gpu(stage, batch: list[tuple[PlannedItem, SampleResult]], host, staged_at: float, waves=None,
             partners=None, ref_waves=None):
        """Encoder thread: start the model work (staged pixels -> latents, captions -> embeddings);
        on a GPU it returns once the batch is queued there, so the next batch is queued behind it.
        With ``waves`` (staged audio), their audio latents are started after the launch (``pend.audio``); with
        ``partners`` (per item ``{name: pixels}``), the partners' latents (``pend.partners``)."""
        captions = [it.caption or "" for it, _ in batch] if stage.text_encoder else None
        pend = stage.launch(host, len(batch), captions, staged_at=staged_at)
        pend.failed = getattr(host, "failed", None) or None  # JPEGs no decoder could read (gpu_decode)
        pend.audio = _audio_latents(stage, waves, staged_at)
        pend.partners = _partner_latents(stage, partners)
        pend.audio_reference = _audio_latents(stage, ref_waves, staged_at)
        return pend

    @staticmethod
    def _text_only(stage, batch: list[tuple[PlannedItem, SampleResult]], waves=None,
                   ref_waves=None, teach=None, handed_at: float | None = None) -> "TextOnlyBatch":
        """Encoder thread: the captions of a batch without pixels through the text encoder, and
        their audio (and their references' audio) through the audio encoder; with ``teach`` (one
        :class:`~shardsmith.records.TeacherInput` per item, one shape), the teacher's trajectories, from
        the items' precomputed embeddings where they carry them."""
        captions = [it.caption or "" for it, _ in batch]
        if teach is not None and all(t.emb is not None for t in teach):
            texts = [(t.emb, None) for t in teach]  # distill.text source: the source's txt_emb.pth
        elif stage.text_encoder is None:
            texts = None
        elif teach is None:  # on the device while the next batch's captions are tokenised
            texts = stage.launch_text(captions)
        else:
            texts = stage.text(captions)  # the teacher below takes them on the device now
        teacher = None
        if teach is not None:  # shardsmith distill: the teacher samples each prompt
            teacher = stage.trajectories([it.item_id for it, _ in batch], texts, teach[0].shape)
        return TextOnlyBatch(texts, _audio_latents(stage, waves, handed_at),
                             _audio_latents(stage, ref_waves, handed_at), teacher)

    def _finish(self, entry) -> None:
        """Calling thread: wait for the batch, serialise members (re-raises an encoder error here).
        Its host copies (dtype, text embeddings) run on one intra-op thread: the decode workers hold
        the cores, and a parallel copy would wait at barriers for threads they leave no room for."""
        _tag, batch, fut = entry
        with one_intra_op_thread():
            done = fut.result()
            z, texts = done.result_batch()
            audio = _audio_out(self.stage, getattr(done, "audio", None))
            partners = getattr(done, "partners", None)
            ref_audio = _audio_out(self.stage, getattr(done, "audio_reference", None))
            teacher = getattr(done, "teacher", None)
            failed = getattr(done, "failed", None)
            if failed:  # decoded on the device, and unreadable there and on the CPU: failed, not written
                batch, z, texts, audio, partners, ref_audio = _drop_failed(batch, failed, z, texts, audio,
                                                                           partners, ref_audio)
                if not batch:
                    return
            if self.memo is not None and z is not None and partners is None and ref_audio is None:
                self.memo.put([item for item, _ in batch], z, texts, [geometry(res) for _, res in batch], audio)
            self._render(batch, z, texts, audio, partners, ref_audio, teacher)

    def _render(self, batch, z, texts, audio, partners=None, ref_audio=None, teacher=None) -> None:
        """``members.render``, with ``audio=`` / ``partners=`` / ``audio_reference=`` / ``teacher=`` only
        for a renderer that writes them (``takes_audio``, ``takes_teacher``): a latent kept in the memo by
        an output with audio may be read by one without."""
        extra = {k: v for k, v in (("audio", audio), ("partners", partners), ("audio_reference", ref_audio),
                                   ("teacher", teacher)) if v is not None}
        if not extra or not (getattr(self.members, "takes_audio", False) or getattr(self.members, "takes_teacher",
                                                                                    False)):
            self.members.render(batch, z, texts)
        else:
            self.members.render(batch, z, texts, **extra)

    def add(self, item: PlannedItem, res: SampleResult) -> None:
        # (an item with partners is encoded whole: the memo keeps no partner latents)
        kept = self.memo.get(item, geometry(res)) if self.memo is not None and res.partners is None and \
            res.audio_reference is None else None
        if kept is not None:  # encoded for another output already: rendered now, not encoded again
            _ = self.stage  # (the renderer takes the models' identities at the first batch)
            z, text, audio = kept
            res.pixels = res.audio = None
            with one_intra_op_thread():
                self._render([(item, res)], z[None], [text] if text is not None else None,
                             None if audio is None else [audio])
            return
        q = self.pending.setdefault(queue_of(res), [])
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

    def member_sizes(self, item: PlannedItem, res: SampleResult) -> list[tuple[str, int]]:
        """``members.sizes`` with this finisher's stage (loaded here if not yet)."""
        return self.members.sizes(item, res, self.stage)

    def flush(self) -> None:
        """Encode every queued item (partial batches too) and wait until all members exist."""
        self.finish_through(self.seal())

    def close(self) -> None:
        """Wait for this finisher's batches on the device thread and for units being written (a file
        is never left half-written)."""
        wait([fut for _, _, fut in self.in_flight])
        if self._stager is not None:
            self._stager.shutdown(wait=True)
        self.writer.shutdown(wait=True)
