"""A build's model load chain in a fresh interpreter, timed (a diagnostic, not a goal figure).

From the interpreter's start: ``import torch`` (as the build's process has it before its preload), then
:class:`~shardsmith.encode.preload.ModelPreload` as a build starts it (load the workload's models on a thread, then
warm one batch of the bucket shape up: cuDNN's first call), joined. Printed as JSON: the seconds to torch,
to the models loaded and to the warm-up done, and the preload's own figures. Run it with two ``PYTHONPATH``s
(the code before and after a change) alternating, on the same machine, to compare the chains.

    PYTHONPATH=src:bench:tests:/tmp/site python3 bench/load_chain.py small|video|audio
"""

from __future__ import annotations

import json
import sys
import time

T0 = time.perf_counter()


def workload_recipe(name: str) -> dict:
    """The recipe of a workload of bench/cli_gpu_build.py (``small``, ``video``) or bench/audio_build.py
    (``audio``), its sources pointing nowhere (no plan runs here)."""
    from argparse import Namespace
    from pathlib import Path

    src = Path("/tmp")
    if name == "audio":
        from audio_build import recipe

        return recipe(src, Namespace(config="published", batch=64, device="cuda", durations="4.0;8.0"))
    from cli_gpu_build import image_recipe, video_recipe

    return image_recipe(src, 256, "auto", 64, "off") if name == "small" else video_recipe(src, 512, 768, 121, "off")


def main() -> None:
    import torch  # noqa: F401 - the build's process has torch before its preload starts

    t_torch = time.perf_counter() - T0
    from shardsmith.encode.preload import ModelPreload
    from shardsmith.recipe import recipe_from_dict

    rec = recipe_from_dict(workload_recipe(sys.argv[1]))
    t = time.perf_counter()
    pre = ModelPreload(rec)
    pre.start()
    pre._thread.join()  # the load and the warm-up of every bucket shape (none is stopped: no plan)
    stage = pre.result()
    info = stage.warm_up_info or {}
    print(json.dumps({"workload": sys.argv[1], "torch_s": round(t_torch, 3),
                      "preload_s": round(time.perf_counter() - t, 3), "total_s": round(time.perf_counter() - T0, 3),
                      "load_s": pre.seconds.get("load"), "warm_up_s": info.get("seconds"),
                      "warmed": info.get("shapes") or info.get("audio")}))


if __name__ == "__main__":
    main()
