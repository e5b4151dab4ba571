"""``distill.preview``: the teacher on a few real training prompts, decoded to pictures, before the run.

Contract
- ``write_preview(stage, recipe, ledger, root)``: the first ``distill.preview`` train items with a
  caption (plan order) are sampled exactly as the run samples them (same seeds, same solver), their
  final samples decoded by ``models.vae`` and written as ``NN.png`` to ``root/.shardsmith/preview/``
  with ``preview.json`` (per picture: prompt, item id, seed; ``meaningless`` and ``why`` when the
  teacher or the VAE has random weights). Nothing is done when ``preview.json`` exists (a resumed
  run), or when ``distill.preview`` is 0. Returns the ``preview.json`` content or None.
- The samples' latents must be what ``models.vae`` decodes (``distill.shape`` its channels): a
  mismatch is one warning in ``preview.json``, never the run's failure.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from shardsmith.atomic import atomic_write_bytes, atomic_write_json
from shardsmith.formats.build_dir import STATE_DIR
from shardsmith.split.assign import TRAIN

PREVIEW_DIR = f"{STATE_DIR}/preview"
PREVIEW_FILE = "preview.json"


def write_preview(stage, recipe, ledger, root: Path) -> dict[str, Any] | None:
    n = recipe.distill.preview
    folder = root / PREVIEW_DIR
    if not n or (folder / PREVIEW_FILE).is_file():
        return None
    from PIL import Image

    from shardsmith.distill.trajectories import sample_seed
    from shardsmith.encode.vae import load_vae
    from shardsmith.precheck import load_errors, local_path
    from shardsmith.verify.decode import _to_uint8

    items = []
    for item in ledger.items(split=TRAIN, status="ok"):
        if item.caption and item.caption.strip():
            items.append(item)
            if len(items) >= n:
                break
    if not items:
        return None
    texts = stage.text([it.caption for it in items])
    trajectories = stage.trajectories([it.item_id for it in items], texts)
    stage.launched -= len(items)  # the preview is not one of the run's samples
    v = recipe.models.vae
    with load_errors("vae", v):
        vae = load_vae(v.family, pretrained=local_path(v.pretrained), subfolder=v.subfolder, revision=v.revision,
                       config=v.config, dtype=v.dtype, device=stage.teacher.device)
    random = [name for name, prov in (("teacher", stage.teacher.provenance), ("vae", vae.provenance))
              if prov.is_random]
    folder.mkdir(parents=True, exist_ok=True)
    pictures, warning = [], None
    for i, (item, tr) in enumerate(zip(items, trajectories)):
        z = tr.latent[None]
        if z.ndim == 4 and vae.spec.kind == "video_vae":
            z = z[:, :, None]
        try:
            pixels = vae.decode(z)[0]
        except ValueError as exc:
            warning = f"the teacher's samples cannot be decoded by models.vae: {exc}"
            break
        frame = _to_uint8(pixels)[0]
        buf = io.BytesIO()
        Image.fromarray(frame).save(buf, format="PNG")
        name = f"{i:02d}.png"
        atomic_write_bytes(folder / name, buf.getvalue())
        pictures.append({"file": name, "prompt": item.caption, "id": item.item_id,
                         "seed": sample_seed(recipe.distill.seed, item.item_id)})
    info = {"pictures": pictures, "meaningless": bool(random),
            "why": (f"{' and '.join(random)} use RANDOM WEIGHTS: the pictures check the plumbing only"
                    if random else None), "warning": warning}
    atomic_write_json(folder / PREVIEW_FILE, info)
    return info
