"""The ``index.json`` of a knowledge-distillation dataset (``kd_wds``), beside its shards.

Contract
- ``kd_index(...)`` builds the file's content: ``format`` (``"shardsmith-kd"``), ``version``,
  ``path_timesteps`` (the times of ``path.pth``'s states: ``t_list`` without its final 0; FastGen's
  ``KDModel`` docstring asks to check them here), ``t_list``, ``parameterisation``, ``solver``,
  ``steps``, ``rho``, ``guidance``, ``negative_prompt`` (``distill.negative_prompt``; None where guidance
  took a source's ``neg_prompt_emb.npy``), ``negative`` (what guidance took as the negative prompt, None
  without guidance: ``{"origin": "source", "file", "sha256"}`` for a source's ``neg_prompt_emb.npy``, or
  ``{"origin": "distill.negative_prompt", "prompt"}``), ``shape`` (None: each sample's own, from its
  source's ``latent.pth``; its ``json`` says which), ``dtype``, ``has_path``,
  ``seed``, ``teacher`` (its spec and provenance, ``random-weights`` plain to see), ``text``
  (the text encoder's), ``count`` and ``samples``: ``[shard, key, seed]`` of every sample, in
  shard order.
- ``read_kd_index(folder)``: the parsed file, or None when the folder has none.
- The noise convention: ``noise.pth`` is unit-normal; the trajectory starts from ``noise`` (flow)
  or ``noise * t_list[0]`` (edm, sigma_max): ``path[0]`` is that start state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardsmith.atomic import read_json
from shardsmith.formats.wds import KD_INDEX_FILE

KD_FORMAT = "shardsmith-kd"
KD_VERSION = 1


def kd_index(*, t_list: list[float], parameterisation: str, solver: str, steps: int, rho: float, guidance: float,
             negative_prompt: str, shape: list[int] | None, dtype: str, has_path: bool, seed: int,
             teacher: dict[str, Any], text: dict[str, Any] | None, samples: list[tuple[str, str, int]],
             negative: dict[str, Any] | None = None) -> dict:
    if negative is not None and negative.get("origin") == "source":
        negative_prompt = None  # (not the prompt guidance took: the source's embedding, named in negative)
    return {"format": KD_FORMAT, "version": KD_VERSION, "path_timesteps": list(t_list[:-1]), "t_list": list(t_list),
            "parameterisation": parameterisation, "solver": solver, "steps": steps, "rho": rho,
            "guidance": guidance, "negative_prompt": negative_prompt,
            "negative": None if negative is None else dict(negative), "shape": None if shape is None else list(shape),
            "dtype": dtype,
            "has_path": has_path, "seed": seed,
            "noise": "unit normal; path[0] = noise (flow) or noise * t_list[0] (edm)",
            "teacher": teacher, "text": text, "count": len(samples), "samples": [list(s) for s in samples]}


def read_kd_index(folder: str | Path) -> dict | None:
    f = Path(folder) / KD_INDEX_FILE
    if not f.is_file():
        return None
    return read_json(f)
