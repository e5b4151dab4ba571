"""Staging a batch while every core but two is busy (as the decode workers keep them in a GPU
build): torch.stack on torch's default intra-op threads, the same inside ``one_intra_op_thread``
(what ``EncodeStage.stage`` does), and np.stack. 64 frames of 256x256x3 uint8, 40 batches per
timing, 5 interleaved repeats, medians; then the same with the cores idle.

    PYTHONPATH=src python3 bench/stage_busy_cores.py [--busy N] [--json OUT]
"""
import argparse, json, multiprocessing as mp, os, statistics, time
import numpy as np, torch
from shardsmith.encode.host_threads import one_intra_op_thread


def spin(stop):
    x = 0
    while not stop.is_set():
        for i in range(100_000):
            x += i


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--busy", type=int, default=max(1, (os.cpu_count() or 4) - 2))
    ap.add_argument("--json")
    a = ap.parse_args()
    frames = [np.random.randint(0, 255, (1, 256, 256, 3), dtype=np.uint8) for _ in range(64)]
    views = [torch.from_numpy(f) for f in frames]
    host = torch.empty((64, 1, 256, 256, 3), dtype=torch.uint8)

    def torch_default():
        torch.stack(views, out=host)

    def torch_one_thread():
        with one_intra_op_thread():
            torch.stack(views, out=host)

    def numpy_stack():
        np.stack(frames, out=host.numpy())

    fns = (torch_default, torch_one_thread, numpy_stack)
    out = {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "busy_processes": a.busy}
    for label, busy in (("busy", a.busy), ("idle", 0)):
        stop = mp.Event()
        ps = [mp.Process(target=spin, args=(stop,), daemon=True) for _ in range(busy)]
        for p in ps:
            p.start()
        time.sleep(0.5)
        res = {}
        for _ in range(5):
            for fn in fns:
                t = time.perf_counter()
                for _ in range(40):
                    fn()
                res.setdefault(fn.__name__, []).append((time.perf_counter() - t) / 40 * 1e3)
        stop.set()
        for p in ps:
            p.join()
        out[label] = {k: round(statistics.median(v), 3) for k, v in res.items()}
        print(label, f"({busy} busy processes, {torch.get_num_threads()} torch threads): ms per batch",
              out[label], flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
