"""Time grids for the teacher's ODE: ``steps`` solver steps from ``t_list[0]`` down to 0 that hold
every ``t_list`` entry exactly.

Contract
- ``time_grid(steps, t_list, rho)`` -> ``(grid, where)``: ``grid`` is a strictly decreasing list of
  ``steps + 1`` floats from ``t_list[0]`` to ``t_list[-1] == 0.0``; ``grid[where[i]] == t_list[i]``
  exactly (the very same float). Works in the variable ``u = t ** (1 / rho)``: each segment
  ``[t_list[i], t_list[i+1]]`` gets a share of the steps proportional to its length in ``u``
  (largest-remainder rounding, at least one step each), and inside a segment the points are evenly
  spaced in ``u`` (``rho = 1``: uniform in ``t``, the flow default; ``rho = 7``: Karras et al.'s
  spacing, the edm default).
- Nested grids: when every quota ``steps * length_i / total`` is an integer (e.g. ``t_list
  [1.0, 0.5, 0.0]``, ``rho = 1``, even ``steps``), the allocation is exact, doubling ``steps``
  doubles every segment's count and ``time_grid(2 * steps, ...)[0][::2] == time_grid(steps, ...)[0]``.
  Otherwise rounding may move a step between segments as ``steps`` grows.
- ``check_t_list(t_list)``: the ``t_list`` rules alone (the first four below), for the recipe's own check.
- Refused (``ValueError`` naming the numbers and the fix): ``t_list`` with fewer than 2 entries, a
  non-finite or negative entry, entries that are not strictly decreasing, a last entry other than
  0.0, ``steps`` not an integer, fewer than the ``len(t_list) - 1`` segments or more than
  :data:`MAX_STEPS`, ``rho`` outside [:data:`MIN_RHO`, :data:`MAX_RHO`] (or not finite), times whose
  ``t ** (1 / rho)`` leaves float64. Every check is made before the grid is built, so a huge
  ``steps`` is refused at once rather than filling memory.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

#: the most solver steps a trajectory takes: every step is one teacher call per sample (two with heun),
#: and published teachers sample in tens of steps; beyond this the run would not finish in a lifetime
MAX_STEPS = 10_000
#: the range of rho taken: 1 spaces the steps evenly in t, 7 is Karras et al.'s spacing; far outside it the
#: steps of a segment all crowd at one end, and t ** (1 / rho) leaves float64 (1e-300 divided by zero, 1e5
#: put two grid points at 0.0)
MIN_RHO, MAX_RHO = 0.1, 100.0


def check_t_list(t_list: Sequence[float]) -> list[float]:
    """``t_list`` as floats, or a ``ValueError`` saying which rule it breaks (the first of: at least 2 entries,
    every one finite and >= 0, strictly decreasing, ending at 0.0) and how to fix it."""
    ts = [float(t) for t in t_list]
    if len(ts) < 2:
        raise ValueError(f"t_list {ts} has {len(ts)} entr{'y' if len(ts) == 1 else 'ies'}; it needs at least 2: "
                         "the start time and the final 0.0 (e.g. [0.999, 0.0])")
    bad = [t for t in ts if not math.isfinite(t)]
    if bad:
        raise ValueError(f"t_list {ts} holds {bad[0]}; every entry must be a finite number")
    negative = [t for t in ts if t < 0]
    if negative:
        raise ValueError(f"t_list {ts} holds the negative time {negative[0]}; times run from t_list[0] down to 0.0, "
                         "so every entry must be >= 0")
    for i in range(len(ts) - 1):
        if not ts[i] > ts[i + 1]:
            raise ValueError(f"t_list {ts} is not strictly decreasing: entry {i} is {ts[i]} and entry {i + 1} is "
                             f"{ts[i + 1]}; list the times from the start (largest) down to 0.0 without repeats")
    if ts[-1] != 0.0:
        raise ValueError(f"t_list {ts} ends at {ts[-1]}, not 0.0; the trajectory ends at the clean sample: "
                         "append 0.0")
    return ts


def _check(steps: int, t_list: Sequence[float], rho: float) -> list[float]:
    ts = check_t_list(t_list)
    if isinstance(steps, bool) or not isinstance(steps, numbers.Integral):
        raise ValueError(f"steps {steps!r} is not an integer; give a whole number of solver steps")
    if steps > MAX_STEPS:
        raise ValueError(f"steps {steps} is more than {MAX_STEPS}, the most shardsmith takes (every step is one "
                         "teacher call per sample, two with heun; teachers sample in tens of steps): set steps "
                         f"<= {MAX_STEPS}, e.g. 32")
    segments = len(ts) - 1
    if steps < segments:
        raise ValueError(f"steps {steps} is fewer than the {segments} segments of t_list {ts}: each segment "
                         f"needs at least one step; set steps >= {segments}")
    if not (math.isfinite(rho) and rho > 0):
        raise ValueError(f"rho {rho} must be a finite number > 0 (1 for uniform steps in t, 7 for Karras spacing)")
    if not MIN_RHO <= rho <= MAX_RHO:
        raise ValueError(f"rho {rho:g} is outside [{MIN_RHO:g}, {MAX_RHO:g}]: the steps of a segment are spaced "
                         f"evenly in t ** (1 / rho), and a rho that {'small' if rho < MIN_RHO else 'large'} crowds "
                         "them all at one end of it (the grid leaves float64); use 1 for uniform steps in t or 7 "
                         "for Karras spacing")
    return ts


def _u(ts: list[float], rho: float) -> list[float]:
    """``t ** (1 / rho)`` of each time; a ``ValueError`` where that leaves float64 or gives no length at all."""
    try:
        us = [t ** (1.0 / rho) for t in ts]
    except OverflowError:
        us = [math.inf]
    if not all(math.isfinite(u) for u in us) or not us[0] > us[-1]:
        raise ValueError(f"t_list {ts} with rho {rho:g}: t ** (1 / rho) of its times is "
                         f"{'not a finite float64' if not all(math.isfinite(u) for u in us) else 'the same for all'}, "
                         "so no grid can be spaced in it; use a rho nearer 1 (e.g. 1 or 7) or smaller times")
    return us


def _allocate(steps: int, lengths: list[float]) -> list[int]:
    """Largest-remainder shares of ``steps`` proportional to ``lengths``, at least 1 each. An integral
    quota that float rounding puts just below its integer keeps its count: its remainder is near 1."""
    total = sum(lengths)
    quotas = [steps * length / total for length in lengths]
    counts = [int(math.floor(q)) for q in quotas]
    order = sorted(range(len(quotas)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in order[: steps - sum(counts)]:
        counts[i] += 1
    for i in range(len(counts)):
        if counts[i] == 0:  # a segment too short for its share: take a step from the one most over its quota
            donor = max((j for j in range(len(counts)) if counts[j] >= 2),
                        key=lambda j: (counts[j] - quotas[j], counts[j], -j))
            counts[donor] -= 1
            counts[i] = 1
    return counts


def time_grid(steps: int, t_list: Sequence[float], rho: float = 1.0) -> tuple[list[float], list[int]]:
    """A strictly decreasing grid of ``steps + 1`` times from ``t_list[0]`` to 0 holding every
    ``t_list`` entry; returns ``(grid, where)`` with ``grid[where[i]] == t_list[i]``."""
    ts = _check(steps, t_list, float(rho))
    rho = float(rho)
    us = _u(ts, rho)
    counts = _allocate(int(steps), [us[i] - us[i + 1] for i in range(len(us) - 1)])
    grid, where = [ts[0]], [0]
    for i, n in enumerate(counts):
        ua, ub = us[i], us[i + 1]
        for j in range(1, n):
            grid.append((ua + (ub - ua) * (j / n)) ** rho)
        grid.append(ts[i + 1])
        where.append(len(grid) - 1)
    for k in range(len(grid) - 1):
        if not grid[k] > grid[k + 1]:
            raise ValueError(f"steps {steps} with rho {rho} puts two grid points at {grid[k]} (between t_list "
                             f"entries {ts}); the segment is too short for its steps in float64: use fewer steps")
    return grid, where
