"""Staging a batch under GIL contention: ``EncodeStage.stage`` (torch.stack, which copies with the GIL
released) against the np.stack it replaced, alone and beside a Python thread that wants the GIL (as the
encoder thread launching kernels does), switch interval 0.1 ms as in a GPU build. 64 frames of
256x256x3 uint8, 40 batches per timing, 5 interleaved repeats, medians.

    PYTHONPATH=src python3 bench/stage_contention.py
"""
import statistics, sys, threading, time, types
import numpy as np, torch
from shardsmith.encode.stage import EncodeStage
sys.setswitchinterval(0.0001)
torch.set_num_threads(1)
frames = [np.random.randint(0, 255, (1, 256, 256, 3), dtype=np.uint8) for _ in range(64)]
st = types.SimpleNamespace(device="cpu", batch_size=64, seconds={"prepare": 0.0})

def new():
    return EncodeStage.stage(st, frames)

def old():
    return torch.from_numpy(np.stack(frames))

assert torch.equal(new(), old())
res = {}
for rep in range(5):
    for fn in (old, new):
        for contended in (False, True):
            stop, count = [False], [0]
            def spin():
                while not stop[0]:
                    count[0] += 1
            th = threading.Thread(target=spin) if contended else None
            if th: th.start(); time.sleep(0.02)
            t = time.perf_counter()
            for _ in range(40): fn()
            dt = (time.perf_counter() - t) / 40
            stop[0] = True
            if th: th.join()
            res.setdefault((fn.__name__, contended), []).append(dt)
for k, v in sorted(res.items()):
    print(k, f"median {statistics.median(v)*1e3:.2f} ms per batch of 64 x 256x256x3")
print("contended old/new:", statistics.median(res[("old", True)]) / statistics.median(res[("new", True)]))
print("alone old/new:", statistics.median(res[("old", False)]) / statistics.median(res[("new", False)]))
