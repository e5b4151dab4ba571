"""``verify`` of a ``.precomputed/`` tree, as the LTX trainer reads it.

:func:`verify_precomputed` fills the report ``verify`` started (``world`` 1, ``workers`` 0, the
tree's ``dirs``) with checks ``pairing`` (every sub-folder pairs by relative path),
``latent_grid``, ``attention_mask`` (int64), ``finite:<key>`` and, when the build that wrote the
tree has a manifest, ``manifest``; plus ``contract`` and ``coverage``. The folder names come from
``formats.precomputed``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardsmith.formats import precomputed as precomputed_layout
from shardsmith.verify.contract import ContractRecorder
from shardsmith.verify.owning_build import manifest_count


def verify_precomputed(root: Path, report: dict[str, Any], check, checks: list) -> dict[str, Any]:
    """The LTX trainer's view of a ``.precomputed/`` tree: every sub-folder pairs by relative path,
    each latent dict's grid matches its tensor, conditions carry embeddings and an int64 mask."""
    import torch

    from shardsmith.loaders.precomputed import PrecomputedDataset

    dirs = precomputed_layout.present_dirs(root)
    ds = PrecomputedDataset(root, dirs)
    report.update(world=1, workers=0, dirs=dirs)
    check("pairing", not ds.unmatched, f"{len(ds)} sample(s) present in every folder {dirs}" if not ds.unmatched else
          f"{len(ds.unmatched)} file(s) lack a partner, e.g. {ds.unmatched[0][0]} missing in {ds.unmatched[0][1]}; "
          "LTX trainers silently skip those")
    rec, bad_grid, bad_mask = ContractRecorder(), [], []
    for i in range(len(ds)):
        it = ds[i]
        flat = {}
        for d in dirs:
            for k, v in it[d].items():
                flat[f"{d}.{k}"] = v.unsqueeze(0) if torch.is_tensor(v) else [v]
        lat = it.get(precomputed_layout.LATENTS)
        if lat is not None and tuple(lat["latents"].shape[1:]) != (lat["num_frames"], lat["height"], lat["width"]):
            bad_grid.append(it["path"])
        cond = it.get(precomputed_layout.CONDITIONS)
        if cond is not None and cond["prompt_attention_mask"].dtype != torch.int64:
            bad_mask.append(it["path"])
        flat["__key__"] = [it["path"]]
        rec.add(flat)
    check("latent_grid", not bad_grid, "num_frames/height/width match every latent tensor" if not bad_grid else
          f"{len(bad_grid)} latent dict(s) whose grid disagrees with the tensor, e.g. {bad_grid[:2]}")
    check("attention_mask", not bad_mask, "prompt_attention_mask is int64 everywhere" if not bad_mask else
          f"{len(bad_mask)} condition(s) with a non-int64 mask, e.g. {bad_mask[:2]}")
    c = rec.to_dict()
    report["contract"] = c
    report["coverage"] = {"expected": len(ds) + len(ds.unmatched), "seen": len(ds), "unique": len(ds),
                          "unmatched": [r for r, _ in ds.unmatched[:20]]}
    for key, st in c["keys"].items():
        if st.get("type") == "tensor" and (st.get("nan") or st.get("inf")):
            check(f"finite:{key}", False, f"{key} holds {st['nan']} NaN and {st['inf']} Inf values")
    mcount, mwhere = manifest_count(root)
    if mcount is not None:
        check("manifest", mcount == len(ds), f"{mwhere} says written={mcount}; the tree pairs {len(ds)}")
    report["checks"] = checks
    report["ok"] = all(ch["ok"] for ch in checks)
    return report
