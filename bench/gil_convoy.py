"""The interpreter lock's convoy, on any machine (a diagnostic for BENCHMARKS.md §7, eighteenth session).

One thread runs small torch ops back to back, as the audio encoder's thread queues its kernels. Each op lets the
interpreter lock go, and the thread must take it back afterwards. Beside it run 0, 1 or 2 threads of plain Python
work (the build's main thread rendering members, say). A thread waiting for the lock gets it only after the
holder has run for the switch interval (``sys.setswitchinterval``, 5 ms by default). So each op can wait that
long. Printed: the ops a second for each switch interval and number of busy threads.

    python3 bench/gil_convoy.py [--ops 20000] [--out r.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time


def _launcher(n: int) -> float:
    import torch

    x = torch.zeros(256)
    t = time.perf_counter()
    for _ in range(n):
        x = x + 1.0
    return n / (time.perf_counter() - t)


def _busy(stop: threading.Event) -> None:
    s = 0
    while not stop.is_set():
        for i in range(1000):
            s += i


def main() -> None:
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=int, default=20000)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    _launcher(1000)  # warm-up
    rows = []
    for interval in (0.005, 0.0005, 0.0001):
        sys.setswitchinterval(interval)
        for others in (0, 1, 2):
            stop = threading.Event()
            threads = [threading.Thread(target=_busy, args=(stop,)) for _ in range(others)]
            for t in threads:
                t.start()
            rate = _launcher(args.ops)
            stop.set()
            for t in threads:
                t.join()
            rows.append({"switch_interval_ms": interval * 1e3, "busy_python_threads": others, "torch_ops_per_s": round(rate)})
            print(f"switch interval {interval * 1e3:.1f} ms, {others} busy Python thread(s): {rate:,.0f} torch ops/s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"label": "diagnostic: the interpreter lock's convoy", "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
