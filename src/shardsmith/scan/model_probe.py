"""``scan --recipe R --probe-models``: the recipe's models loaded on its device, one timed batch of each
bucket, of text and of each known audio duration (:meth:`~shardsmith.encode.device_thread.DeviceThread.warm_up`
with ``timed``).

Contract: ``probe_models(recipe, items)`` returns ``{"device", "models": [...], "free_bytes",
"total_bytes", "lines"}``: each model's :class:`~shardsmith.encode.memory_plan.ModelMemory` figures
(peaks measured on a GPU only), and the lines :func:`~shardsmith.encode.memory_plan.summary` prints,
with the expected encode time for ``items`` (the usable items, when known).
"""

from __future__ import annotations

from typing import Any


def probe_models(recipe, items: int | None) -> dict[str, Any]:
    from shardsmith.encode.memory_plan import gpu_free_total, summary
    from shardsmith.encode.stage import EncodeStage

    stage = EncodeStage.from_recipe(recipe)
    try:
        stage.warm_up_for(recipe, timed=True)
        free, total = gpu_free_total(getattr(stage, "device_index", None)) if stage.device == "cuda" else (None, None)
        mems = getattr(stage, "memory", [])
        return {"device": stage.device, "models": [m.to_dict() for m in mems], "free_bytes": free,
                "total_bytes": total, "lines": ["models: " + line for line in summary(mems, free, total, items)]}
    finally:
        stage.close()
