"""A build's model load chain in a fresh interpreter, timed (a diagnostic, not a goal figure).

From the interpreter's start: ``import torch`` (as the build's process has it before its preload), then
:class:`~shardsmith.encode.preload.ModelPreload` as a build starts it (load the workload's models on a thread, then
warm one batch of the bucket shape up: cuDNN's first call), joined. Printed as JSON: the seconds to torch,
to the models loaded and to the warm-up done, and the preload's own figures. Run it with two ``PYTHONPATH``s
(the code before and after a change) alternating, on the same machine, to compare the chains.

    PYTHONPATH=src:/tmp/site python3 bench/load_chain.py small|video|audio
"""

from __future__ import annotations

import json
import sys
import time

T0 = time.perf_counter()

RECIPES = {  # bench/cli_gpu_build.py's and bench/audio_build.py's models, at their buckets
    "small": {"geometry": {"buckets": ["256x256x1"]}, "outputs": [{"format": "latent_wds", "dir": "lat"}],
              "models": {"vae": {"family": "sd", "config": "published", "dtype": "bfloat16"}, "batch_size": 64}},
    "video": {"geometry": {"buckets": ["768x512x121"]}, "outputs": [{"format": "precomputed"}],
              "models": {"vae": {"family": "ltx2", "config": "published", "dtype": "bfloat16"},
                         "text": {"family": "t5", "config": "tiny"}, "batch_size": 1}},
    "audio": {"audio": {"durations": [4.0, 8.0]}, "outputs": [{"format": "latent_wds", "dir": "audio"}],
              "models": {"audio_vae": {"family": "ltx2_audio", "config": "published"}, "batch_size": 64}},
}


def main() -> None:
    import torch  # noqa: F401 - the build's process has torch before its preload starts

    t_torch = time.perf_counter() - T0
    from shardsmith.encode.preload import ModelPreload
    from shardsmith.recipe import recipe_from_dict

    rec = recipe_from_dict({"sources": [{"path": "/tmp"}], **RECIPES[sys.argv[1]]})
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
