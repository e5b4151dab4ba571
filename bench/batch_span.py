"""Where a build's batch spends its GPU time beyond the encoder's forward pass (a diagnostic for BENCHMARKS.md §10).

One process, one model (published config, random weights, bf16), the build's cuDNN mode (heuristics, deterministic
kernels). Median GPU seconds (CUDA events) over ``--repeats`` after two warm-ups, of:
- ``forward``: ``vae.encode`` of a resident bf16 batch in [-1, 1] (what bench/cli_gpu_build.py's encoder alone runs);
- ``to_input``: the build's input step alone (``EncodeStage._to_input``: the page-locked uint8 batch uploaded on a
  side stream, permuted to channels-first bf16 in [-1, 1]);
- ``launch``: a whole batch as the build launches it (``EncodeStage.launch``: its recorded span, start to the end
  of the VAE's work, the latents' copy back included).

    PYTHONPATH=src:bench:tests python3 bench/batch_span.py --family ltx2 --shape 1,121,512,768 --out r.json
"""

from __future__ import annotations

import argparse
import json
import statistics


def main() -> None:
    import torch

    from shardsmith.encode.stage import EncodeStage
    from shardsmith.encode.vae import load_vae

    ap = argparse.ArgumentParser()
    ap.add_argument("--family", default="ltx2")
    ap.add_argument("--shape", default="1,121,512,768", help="B,F,H,W of the uint8 batch (F=1 for an image VAE)")
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = False, True  # the build's mode
    vae = load_vae(args.family, config="published", dtype="bfloat16", device="cuda")
    b, f, h, w = (int(v) for v in args.shape.split(","))
    stage = EncodeStage(vae, None, batch_size=b, device="cuda", compile="off")
    host = torch.randint(0, 256, (b, f, h, w, 3), dtype=torch.uint8).pin_memory()
    x = stage._to_input(host).clone()  # the same pixels, resident, as the encoder alone takes them

    def span(run) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    def launched() -> float:
        pend = stage.launch(host, b)
        pend.result_batch()
        return pend.start.elapsed_time(pend.vae_end) / 1e3

    ways = {"forward": lambda: span(lambda: vae.encode(x)), "to_input": lambda: span(lambda: stage._to_input(host)),
            "launch": launched}
    res: dict = {"family": args.family, "shape": args.shape, "gpu": torch.cuda.get_device_name(), "median_s": {}}
    for name, run in ways.items():
        for _ in range(2):
            run()
        res["median_s"][name] = round(statistics.median(run() for _ in range(args.repeats)), 4)
        print(name, res["median_s"][name], flush=True)
    if args.out:
        with open(args.out, "w") as f_:
            json.dump(res, f_, indent=1)


if __name__ == "__main__":
    main()
