"""ODE solvers for teacher trajectories, in the flow and the EDM parameterisation.

Contract
- A :data:`Derivative` maps ``(x [B, ...], t)`` to ``dx/dt`` shaped like ``x``; ``t`` is a Python
  float, one time for the whole batch.
- ``flow_derivative(velocity)``: ``dx/dt = v(x, t)`` (rectified flow, ``x_t = (1 - t) x0 + t eps``).
  ``edm_derivative(denoise)``: ``dx/dsigma = (x - D(x, sigma)) / sigma`` (``x = x0 + sigma eps``);
  it refuses ``sigma == 0``, where it is undefined.
- ``start_state(noise, t_max, parameterisation)``: the state at ``t_max``: a copy of the noise for
  ``flow`` (FastGen's convention), ``noise * t_max`` for ``edm``.
- ``solve(derivative, x_start, grid, solver=, keep=, euler_at_zero=)``: integrates from ``grid[0]``
  through every grid point to ``grid[-1]``; returns ``(final state, [state at grid[k] for k in
  keep])`` (``keep`` may hold 0, the start state). ``solver``: ``euler`` (first order) or ``heun``
  (second order, Karras et al. 2022 Alg. 1: Euler predictor, trapezoidal corrector with the
  derivative at the next time). ``euler_at_zero=True``: a step that ends at ``t == 0`` is a plain
  Euler step (pass it for edm). The state's dtype is float64 when ``x_start`` is float64, float32
  otherwise (bf16 / fp16 starts are promoted); the derivative's output is cast to it, so a bf16
  teacher still gives float32 states. Runs under ``torch.no_grad``. An unknown solver, an empty
  grid or a ``keep`` index outside the grid is a ``ValueError``.
- ``evaluations(solver, grid, euler_at_zero)``: derivative evaluations ``solve`` makes on ``grid``:
  ``steps`` for euler, ``2 * steps`` for heun less one per step that ends at 0 with ``euler_at_zero``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

Derivative = Callable[[torch.Tensor, float], torch.Tensor]

SOLVERS = ("euler", "heun")
PARAMETERISATIONS = ("flow", "edm")


def flow_derivative(velocity: Callable[[torch.Tensor, float], torch.Tensor]) -> Derivative:
    """``dx/dt = velocity(x, t)``."""

    def derivative(x: torch.Tensor, t: float) -> torch.Tensor:
        return velocity(x, t)

    return derivative


def edm_derivative(denoise: Callable[[torch.Tensor, float], torch.Tensor]) -> Derivative:
    """``dx/dsigma = (x - denoise(x, sigma)) / sigma``; ``sigma == 0`` is refused."""

    def derivative(x: torch.Tensor, sigma: float) -> torch.Tensor:
        if sigma == 0:
            raise ValueError("the edm derivative (x - D(x, sigma)) / sigma is undefined at sigma = 0; "
                             "solve with euler_at_zero=True so the step to 0 does not evaluate it there")
        return (x - denoise(x, sigma).to(x.dtype)) / sigma

    return derivative


def start_state(noise: torch.Tensor, t_max: float, parameterisation: str) -> torch.Tensor:
    """The state at ``t_max``: the noise (a copy) for flow, ``noise * t_max`` for edm."""
    if parameterisation == "flow":
        if not 0 < t_max <= 1:
            raise ValueError(f"flow t_max {t_max} must lie in (0, 1]")
        return noise.clone()
    if parameterisation == "edm":
        if not t_max > 0:
            raise ValueError(f"edm sigma_max {t_max} must be > 0")
        return noise * float(t_max)
    raise ValueError(f"parameterisation {parameterisation!r} is not one of {', '.join(PARAMETERISATIONS)}")


def _check_solver(solver: str) -> None:
    if solver not in SOLVERS:
        raise ValueError(f"solver {solver!r} is not one of {', '.join(SOLVERS)}")


def evaluations(solver: str, grid: Sequence[float], euler_at_zero: bool) -> int:
    """Derivative evaluations ``solve`` makes on ``grid``."""
    _check_solver(solver)
    steps = max(len(grid) - 1, 0)
    if solver == "euler":
        return steps
    at_zero = sum(1 for k in range(1, len(grid)) if float(grid[k]) == 0.0) if euler_at_zero else 0
    return 2 * steps - at_zero


def _state_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


@torch.no_grad()
def solve(derivative: Derivative, x_start: torch.Tensor, grid: Sequence[float], *, solver: str = "euler",
          keep: Sequence[int] = (), euler_at_zero: bool = False) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Integrate from ``grid[0]`` to ``grid[-1]``; ``(final state, [state at grid[k] for k in keep])``."""
    _check_solver(solver)
    times = [float(t) for t in grid]
    if not times:
        raise ValueError("solve needs a grid with at least one time")
    wanted = [int(k) for k in keep]
    outside = [k for k in wanted if not 0 <= k < len(times)]
    if outside:
        raise ValueError(f"keep index {outside[0]} is outside the grid of {len(times)} times (0..{len(times) - 1})")
    dtype = _state_dtype(x_start)
    x = x_start.to(dtype).clone()
    kept: dict[int, torch.Tensor] = {0: x} if 0 in wanted else {}
    for k in range(len(times) - 1):
        t, t_next = times[k], times[k + 1]
        h = t_next - t
        d = derivative(x, t).to(dtype)
        x_next = x + h * d
        if solver == "heun" and not (euler_at_zero and t_next == 0.0):
            d_next = derivative(x_next, t_next).to(dtype)
            x_next = x + h * (0.5 * d + 0.5 * d_next)
        x = x_next
        if k + 1 in wanted:
            kept[k + 1] = x
    return x, [kept[k] for k in wanted]
