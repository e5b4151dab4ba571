"""Summarise ``py-spy record --native --threads --idle --format raw`` output, thread by thread (a diagnostic).

For each of the busiest threads: its samples, where they fall (waiting to take the interpreter lock back
inside a torch call, another wait on a condition, waiting for work or results, running), its leaf frames,
and the Python functions on its stacks (inclusive). BENCHMARKS.md §7 (eighteenth session) used it to find the
audio encoder's thread waiting for the interpreter lock after its torch calls.

    python3 bench/pyspy_summary.py prof.txt [--threads 8]
"""

from __future__ import annotations

import argparse
import collections
import re

_FILE = re.compile(r"\s*\(([^)]*/)?([^/)]+)\)")  # "f (/long/path/file.py:12)" -> "f (file.py:12)"


def _short(frame: str) -> str:
    return _FILE.sub(r" (\2)", frame)[:110]


def category(stack: str) -> str:
    """Where one sample's thread was: ``lock wait in torch`` (a torch binding taking the interpreter lock back),
    ``waiting`` (a future, queue or condition: no work), ``other wait`` (a native condition wait, often the
    lock) or ``running`` (on a CPU, or blocked in a system call such as ``poll``)."""
    if "pthread_cond_timedwait" in stack and any(k in stack for k in (
            "gil_scoped", "THPVariable_clear", "decref_pyobject", "incref_pyobject", "take_gil")):
        return "lock wait in torch"
    if any(k in stack for k in ("Future.result", "Condition.wait", "Queue.get", "_queue", "Event.wait")):
        return "waiting"
    if "pthread_cond_timedwait" in stack:
        return "other wait"
    return "running"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("raw")
    ap.add_argument("--threads", type=int, default=8)
    args = ap.parse_args()
    threads: dict = collections.defaultdict(lambda: [0, collections.Counter(), collections.Counter(),
                                                     collections.Counter()])
    for line in open(args.raw):
        stack, _, n = line.rstrip().rpartition(" ")
        if not stack:
            continue
        frames, n = stack.split(";"), int(n)
        t = threads[frames[0]]
        t[0] += n
        t[1][_short(frames[-1])] += n
        for f in {re.sub(r":\d+\)", ")", _short(x)) for x in frames[1:]}:
            t[2][f] += n
        t[3][category(stack)] += n
    print("total samples", sum(t[0] for t in threads.values()))
    for name, (n, leaf, incl, cats) in sorted(threads.items(), key=lambda kv: -kv[1][0])[:args.threads]:
        print(f"\n== {name}: {n} samples; " + ", ".join(f"{k} {100 * v / n:.1f} %" for k, v in cats.most_common()))
        print("  leaf:")
        for f, c in leaf.most_common(15):
            print(f"    {100 * c / n:5.1f}%  {f}")
        print("  inclusive (python frames):")
        for f, c in [x for x in incl.most_common(200) if ".py" in x[0]][:20]:
            print(f"    {100 * c / n:5.1f}%  {f}")


if __name__ == "__main__":
    main()
