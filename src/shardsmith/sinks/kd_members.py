"""The members of a ``kd_wds`` sample, rendered once the teacher has sampled its prompt.

Members, in this order: ``txt`` (the prompt, from the sample maker), ``txt_emb.pth`` (``[L, D]`` in
the output's ``text_dtype``, the bytes ``latent_wds`` writes for the same caption), ``noise.pth``
(the unit-normal noise, ``[*shape]``), ``latent.pth`` (the teacher's final sample at t = 0),
``path.pth`` (with ``path: true``: ``[len(t_list) - 1, *shape]``, the states at ``t_list[:-1]``), each
in the output's ``dtype``, and, with ``metadata``, ``json`` (the maker's: id, source, seed).
"""

from __future__ import annotations

from shardsmith.formats.wds import JSON, LATENT, NOISE, PATH, TEXT_EMB, TXT
from shardsmith.records import PlannedItem, SampleResult
from shardsmith.sinks.latent_members import _DTYPES, _pth_size
from shardsmith.sinks.precomputed import pt_bytes


class KdMembers:
    """A :class:`~shardsmith.encode.finisher.MemberRenderer` for the teacher's batches."""

    takes_teacher = True

    def __init__(self, output, shape: tuple[int, ...], states: int, preview=None):
        self.o, self.shape, self.states = output, tuple(shape), states
        self.preview = preview  # called with the stage before the first batch (distill.preview)

    def start(self, stage) -> None:
        if self.preview is not None:
            self.preview(stage)

    def render(self, batch: list[tuple[PlannedItem, SampleResult]], z, texts, teacher=None) -> None:
        """Set each item's members from its embedding (``texts[i][0]``) and trajectory (``teacher[i]``)."""
        if texts is None or teacher is None:
            raise RuntimeError("kd_wds: a batch came back without text embeddings or trajectories")
        dt = _DTYPES[self.o.dtype]
        for (item, res), (emb, *_rest), tr in zip(batch, texts, teacher):
            out = {TXT: res.members[TXT],
                   TEXT_EMB: pt_bytes(emb.to(_DTYPES[self.o.text_dtype]).contiguous()),
                   NOISE: pt_bytes(tr.noise.to(dt).contiguous()),
                   LATENT: pt_bytes(tr.latent.to(dt).contiguous())}
            if self.o.path:
                out[PATH] = pt_bytes(tr.path.to(dt).contiguous())
            if JSON in res.members:
                out[JSON] = res.members[JSON]
            res.members, res.pixels = out, None

    def sizes(self, item: PlannedItem, res: SampleResult, stage) -> list[tuple[str, int]]:
        """``(suffix, bytes)`` of the members the sample will have, exactly, before it is sampled."""
        ts = stage.text_encoder.spec
        out = [(TXT, len(res.members[TXT])), (TEXT_EMB, _pth_size((ts.max_length, ts.dim), self.o.text_dtype)),
               (NOISE, _pth_size(self.shape, self.o.dtype)), (LATENT, _pth_size(self.shape, self.o.dtype))]
        if self.o.path:
            out.append((PATH, _pth_size((self.states, *self.shape), self.o.dtype)))
        if JSON in res.members:
            out.append((JSON, len(res.members[JSON])))
        return out
