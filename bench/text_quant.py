"""A Gemma-class text encoder in 8-bit and unquantised, through the CLI, in one lease (issue 23).

For each ``models.text.quantize`` (none, int8): ``shardsmith scan --recipe R --probe-models`` (the memory
estimate printed before the run), then ``shardsmith build R --out DIR`` of a ``prompt_wds`` output; reads
the manifest's ``models.memory`` (the peak predicted from the warm-up's probe and the peak measured over
the run) and steady-state prompts/s, and the largest absolute difference between the two builds'
``txt_emb.pth``. Gemma3TextConfig's published defaults, random weights, bf16, the MiniLM tokenizer as the
stand-in (no Gemma tokenizer offline).

Usage: PYTHONPATH=src:tests:bench python3 bench/text_quant.py --work /tmp/tq --out r.json --prompts 1024
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path


def embeddings(folder: Path) -> dict[str, "object"]:
    import torch

    out = {}
    for shard in sorted(folder.rglob("*.tar")):
        with tarfile.open(shard) as tf:
            for m in tf.getmembers():
                if m.name.endswith(".txt_emb.pth"):
                    out[m.name] = torch.load(io.BytesIO(tf.extractfile(m).read()))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--prompts", type=int, default=1024)
    ap.add_argument("--modes", default="none,int8")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--config", default="published")
    args = ap.parse_args()
    from gpu_encode import make_prompts

    args.work.mkdir(parents=True, exist_ok=True)
    table = args.work / "prompts.csv"
    import csv

    with table.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["prompt"])
        for p in make_prompts(args.prompts, 40):
            w.writerow([p])
    res: dict = {"prompts": args.prompts, "runs": []}
    for mode in args.modes.split(","):
        recipe = {"sources": [{"path": str(table), "columns": {"caption": "prompt"}}],
                  "models": {"text": {"family": "gemma", "config": args.config, "dtype": "bfloat16",
                                      "quantize": mode}, "batch_size": args.batch},
                  "outputs": [{"format": "prompt_wds", "dir": "p"}]}
        rp = args.work / f"{mode}.json"
        rp.write_text(json.dumps(recipe))
        run: dict = {"quantize": mode}
        t = time.perf_counter()
        s = subprocess.run([sys.executable, "-m", "shardsmith", "scan", "--recipe", str(rp), "--probe-models", "-q"],
                           capture_output=True, text=True)
        run["scan_s"], run["scan_rc"] = time.perf_counter() - t, s.returncode
        run["scan_lines"] = [ln for ln in s.stdout.splitlines() if ln.startswith("models:")] or s.stderr[-2000:]
        out = args.work / f"out_{mode}"
        t, t_wall = time.perf_counter(), time.time()
        b = subprocess.run([sys.executable, "-m", "shardsmith", "build", str(rp), "--out", str(out), "--no-report"],
                           capture_output=True, text=True)
        run["build_exit_s"], run["build_rc"] = time.perf_counter() - t, b.returncode
        if b.returncode == 0:
            m = json.loads((out / "manifest.json").read_text())
            run["build_to_manifest_s"] = (out / "manifest.json").stat().st_mtime - t_wall
            run["memory"] = m["models"].get("memory")
            run["steady_state"] = m["models"].get("steady_state")
            run["seconds"] = m["models"].get("seconds")
            run["written"] = m["counts"]["written"]
            run["gpu_memory_lines"] = [ln for ln in b.stdout.splitlines() + b.stderr.splitlines() if "GPU memory" in ln]
        else:
            run["stderr"] = b.stderr[-3000:]
        res["runs"].append(run)
        print(json.dumps(run)[:1500], flush=True)
        args.out.write_text(json.dumps(res, indent=1))
    modes = args.modes.split(",")
    if len(modes) == 2 and all(r.get("build_rc") == 0 for r in res["runs"]):
        a, c = embeddings(args.work / f"out_{modes[0]}"), embeddings(args.work / f"out_{modes[1]}")
        diffs = [float((a[k].float() - c[k].float()).abs().max()) for k in a]
        scale = [float(a[k].float().abs().max()) for k in a]
        res["max_abs_diff"], res["max_abs_value"] = max(diffs), max(scale)
        res["embeddings_compared"] = len(diffs)
        print(json.dumps({k: res[k] for k in ("max_abs_diff", "max_abs_value", "embeddings_compared")}))
    args.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
