"""The numerical core of ``shardsmith distill``: time grids holding every ``t_list`` entry, Euler and
Heun solvers for the flow and EDM parameterisations, and the exact Gaussian teacher.

The Gaussian formulas are checked against each other and against quadrature of the posterior (not
trusted); the solvers are then checked against the exact flow maps: their error falls at the
solver's order as the number of steps doubles on nested grids.
"""

from __future__ import annotations

import math

import pytest
import torch

from shardsmith.distill import gaussian
from shardsmith.distill.schedule import time_grid
from shardsmith.distill.solvers import edm_derivative, evaluations, flow_derivative, solve, start_state

FASTGEN_T_LIST = [0.999, 0.937, 0.833, 0.624, 0.0]
# edm: like [80, 10, 1, 0], but the segments' lengths in sigma**(1/7) are 1/4, 1/4, 1/2 of the whole,
# so the step allocation is exact and doubling the steps gives nested grids
EDM_T_LIST = [80.0, 80.0 * 0.75 ** 7, 80.0 * 0.5 ** 7, 0.0]
B = 4


# --------------------------------------------------------------------------- time_grid


def _counts(where: list[int]) -> list[int]:
    return [where[i + 1] - where[i] for i in range(len(where) - 1)]


def _check_grid(grid: list[float], where: list[int], steps: int, t_list: list[float]) -> None:
    assert len(grid) == steps + 1
    assert all(grid[k] > grid[k + 1] for k in range(steps))
    assert where[0] == 0 and where[-1] == steps
    assert [grid[k] for k in where] == t_list  # the very same floats


def test_time_grid_uniform_example():
    grid, where = time_grid(4, [1.0, 0.5, 0.0])
    assert grid == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert where == [0, 2, 4]


@pytest.mark.parametrize("steps, expected", [(32, [2, 3, 7, 20]), (50, [3, 5, 11, 31])])
def test_time_grid_fastgen_default_allocation(steps, expected):
    grid, where = time_grid(steps, FASTGEN_T_LIST)
    _check_grid(grid, where, steps, FASTGEN_T_LIST)
    counts = _counts(where)
    assert counts == expected
    assert sum(counts) == steps and min(counts) >= 1
    lengths = [FASTGEN_T_LIST[i] - FASTGEN_T_LIST[i + 1] for i in range(4)]
    quotas = [steps * d / sum(lengths) for d in lengths]
    assert all(abs(c - q) < 1 for c, q in zip(counts, quotas))  # largest remainder
    for i in range(4):  # uniform in t inside each segment
        seg = grid[where[i]: where[i + 1] + 1]
        diffs = [seg[k] - seg[k + 1] for k in range(len(seg) - 1)]
        assert max(diffs) - min(diffs) < 1e-12


def test_time_grid_rho_spacing():
    grid, where = time_grid(12, [80.0, 10.0, 1.0, 0.0], rho=7.0)
    _check_grid(grid, where, 12, [80.0, 10.0, 1.0, 0.0])
    u = [t ** (1 / 7) for t in grid]
    for i in range(3):
        diffs = [u[k] - u[k + 1] for k in range(where[i], where[i + 1])]
        assert max(diffs) - min(diffs) < 1e-12
    # Karras spacing: the last segment's steps crowd towards 0 (uniform in t would give 1 - 1/n)
    n = _counts(where)[-1]
    assert grid[-2] == pytest.approx((1 / n) ** 7)


@pytest.mark.parametrize("t_list, rho, steps", [([1.0, 0.5, 0.0], 1.0, [4, 8, 16, 32]),
                                                 ([1.0, 0.75, 0.5, 0.0], 1.0, [4, 8, 16, 32]),
                                                 (EDM_T_LIST, 7.0, [4, 8, 16, 32, 64])])
def test_time_grid_doubling_is_nested(t_list, rho, steps):
    for n in steps:
        coarse, w_coarse = time_grid(n, t_list, rho)
        fine, w_fine = time_grid(2 * n, t_list, rho)
        assert fine[::2] == coarse
        assert w_fine == [2 * k for k in w_coarse]


def test_time_grid_at_least_one_step_per_segment():
    # quotas 0.003 and 2.997: the short segment still gets its step, taken from the long one
    assert time_grid(3, [1.0, 0.999, 0.0])[1] == [0, 1, 3]
    assert time_grid(2, [1.0, 0.999, 0.0]) == ([1.0, 0.999, 0.0], [0, 1, 2])


@pytest.mark.parametrize("steps, t_list, rho, message", [
    (2, FASTGEN_T_LIST, 1.0, r"steps 2 is fewer than the 4 segments .*steps >= 4"),
    (8, [1.0, 0.5, 0.5, 0.0], 1.0, r"not strictly decreasing: entry 1 is 0.5 and entry 2 is 0.5"),
    (8, [0.5, 1.0, 0.0], 1.0, r"not strictly decreasing: entry 0 is 0.5 and entry 1 is 1.0"),
    (8, [1.0, 0.1], 1.0, r"ends at 0.1, not 0.0.*append 0.0"),
    (8, [0.0], 1.0, r"has 1 entry; it needs at least 2"),
    (8, [], 1.0, r"has 0 entries; it needs at least 2"),
    (8, [1.0, 0.0, -0.5], 1.0, r"negative time -0.5.*>= 0"),
    (8, [1.0, float("nan"), 0.0], 1.0, r"nan"),
    (8.5, [1.0, 0.0], 1.0, r"steps 8.5 is not an integer"),
    (8, [1.0, 0.0], 0.0, r"rho 0.0 must be a finite number > 0"),
])
def test_time_grid_refusals(steps, t_list, rho, message):
    with pytest.raises(ValueError, match=message):
        time_grid(steps, t_list, rho)


# --------------------------------------------------------------------------- the Gaussian teacher


def _setup(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    cond = torch.randn(B, 3, 2, generator=g) + torch.arange(B).reshape(B, 1, 1)  # distinct means
    x = torch.randn(B, 3, 5, generator=g, dtype=torch.float64)
    return cond, x


def _tb(value: float, like: torch.Tensor) -> torch.Tensor:
    return torch.full((like.shape[0],), float(value), dtype=like.dtype)


def _posterior(x: float, mu: float, log_lik) -> tuple[torch.Tensor, torch.Tensor]:
    """Quadrature nodes over x0 and the normalised posterior weights given the likelihood."""
    s = gaussian.STD
    x0 = torch.linspace(mu - 12 * s, mu + 12 * s, 40001, dtype=torch.float64)
    logw = -((x0 - mu) ** 2) / (2 * s * s) + log_lik(x0)
    w = torch.exp(logw - logw.max())
    return x0, w / w.sum()


def test_cond_mean():
    cond = torch.arange(2 * 3 * 4, dtype=torch.float16).reshape(2, 3, 4)
    mu = gaussian.cond_mean(cond)
    assert mu.dtype == torch.float32 and mu.shape == (2,)
    assert mu.tolist() == [5.5, 17.5]


@pytest.mark.parametrize("t", [0.05, 0.3, 0.7, 0.95])
def test_velocity_is_the_posterior_mean_of_eps_minus_x0(t):
    mu = 0.75  # exact in float32 (cond_mean works in float32)
    for x in (-1.3, 0.2, 2.5):
        # x_t = (1 - t) x0 + t eps: given x0, eps = (x - (1 - t) x0) / t
        x0, w = _posterior(x, mu, lambda x0: -((x - (1 - t) * x0) ** 2) / (2 * t * t))
        expected = float((w * ((x - (1 - t) * x0) / t - x0)).sum())
        got = gaussian.velocity(torch.tensor([[x]], dtype=torch.float64), torch.tensor([t], dtype=torch.float64),
                                torch.full((1, 2, 3), mu))
        assert float(got) == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize("sigma", [0.02, 0.5, 3.0, 80.0])
def test_denoise_is_the_posterior_mean(sigma):
    mu = -0.375  # exact in float32 (cond_mean works in float32)
    for x in (-2.0, 0.1, 1.7 * sigma):
        x0, w = _posterior(x, mu, lambda x0: -((x - x0) ** 2) / (2 * sigma * sigma))
        expected = float((w * x0).sum())
        got = gaussian.denoise(torch.tensor([[x]], dtype=torch.float64), torch.tensor([sigma], dtype=torch.float64),
                               torch.full((1, 2, 3), mu))
        assert float(got) == pytest.approx(expected, abs=1e-9)


def test_velocity_and_denoiser_describe_the_same_data():
    # x_t = (1 - t) (x0 + sigma eps) with sigma = t / (1 - t): v(x, t) = (x - D(x / (1 - t), sigma)) / t
    cond, x = _setup()
    for t in (0.1, 0.5, 0.9):
        v = gaussian.velocity(x, _tb(t, x), cond)
        d = gaussian.denoise(x / (1 - t), _tb(t / (1 - t), x), cond)
        torch.testing.assert_close(v, (x - d) / t, rtol=0, atol=1e-12)


@pytest.mark.parametrize("t_start, t", [(0.999, 0.6), (1.0, 0.3), (0.624, 0.0), (0.4, 0.9)])
def test_velocity_is_the_time_derivative_of_flow_solution(t_start, t):
    cond, x = _setup()
    mu = gaussian.cond_mean(cond)
    h = 1e-5
    fd = (gaussian.flow_solution(x, t_start, t + h, mu) - gaussian.flow_solution(x, t_start, t - h, mu)) / (2 * h)
    xt = gaussian.flow_solution(x, t_start, t, mu)
    torch.testing.assert_close(fd, gaussian.velocity(xt, _tb(t, x), cond), rtol=0, atol=1e-8)
    torch.testing.assert_close(gaussian.flow_solution(x, t_start, t_start, mu), x, rtol=0, atol=1e-14)
    # a flow map: going t_start -> 0.5 -> t is going t_start -> t
    half = gaussian.flow_solution(x, t_start, 0.5, mu)
    torch.testing.assert_close(gaussian.flow_solution(half, 0.5, t, mu), xt, rtol=0, atol=1e-12)


@pytest.mark.parametrize("sigma_start, sigma", [(80.0, 10.0), (80.0, 0.3), (1.0, 0.05), (0.5, 2.0)])
def test_edm_solution_solves_the_edm_ode(sigma_start, sigma):
    cond, x = _setup()
    x = x * sigma_start
    mu = gaussian.cond_mean(cond)
    deriv = edm_derivative(lambda y, s: gaussian.denoise(y, _tb(s, y), cond))
    h = 1e-6 * max(1.0, sigma)
    fd = (gaussian.edm_solution(x, sigma_start, sigma + h, mu) - gaussian.edm_solution(x, sigma_start, sigma - h, mu)) / (2 * h)
    xs = gaussian.edm_solution(x, sigma_start, sigma, mu)
    torch.testing.assert_close(fd, deriv(xs, sigma), rtol=0, atol=1e-7)
    torch.testing.assert_close(gaussian.edm_solution(x, sigma_start, sigma_start, mu), x, rtol=0, atol=1e-12)
    # at sigma = 0 the ODE lands on mu + STD / sqrt(STD^2 + sigma_start^2) (x - mu)
    end = gaussian.edm_solution(x, sigma_start, 0.0, mu)
    m = mu.double().reshape(B, 1, 1)
    scale = gaussian.STD / math.sqrt(gaussian.STD ** 2 + sigma_start ** 2)
    torch.testing.assert_close(end, m + scale * (x - m), rtol=0, atol=1e-12)


# --------------------------------------------------------------------------- solvers against the exact maps


def _problem(parameterisation: str, t_list: list[float], cond: torch.Tensor, noise: torch.Tensor, mu):
    """(derivative, start state, exact solution t -> state) for the Gaussian teacher."""
    x_start = start_state(noise, t_list[0], parameterisation)
    if parameterisation == "flow":
        deriv = flow_derivative(lambda x, t: gaussian.velocity(x, _tb(t, x), cond))
        return deriv, x_start, lambda t: gaussian.flow_solution(x_start, t_list[0], t, mu)
    deriv = edm_derivative(lambda x, s: gaussian.denoise(x, _tb(s, x), cond))
    return deriv, x_start, lambda s: gaussian.edm_solution(x_start, t_list[0], s, mu)


def _errors(parameterisation, solver, t_list, rho, step_counts):
    cond, noise = _setup(1)
    mu = gaussian.cond_mean(cond)
    deriv, x_start, exact = _problem(parameterisation, t_list, cond, noise, mu)
    errors = []
    for n in step_counts:
        grid, where = time_grid(n, t_list, rho)
        final, kept = solve(deriv, x_start, grid, solver=solver, keep=where, euler_at_zero=parameterisation == "edm")
        assert final.dtype == torch.float64 and len(kept) == len(t_list)
        assert torch.equal(kept[0], x_start)
        assert torch.equal(kept[-1], final)
        errors.append(max(float((k - exact(t)).abs().max()) for k, t in zip(kept, t_list)))
    return errors


@pytest.mark.parametrize("parameterisation, solver, t_list, rho, step_counts, order, finest", [
    ("flow", "euler", [1.0, 0.75, 0.5, 0.0], 1.0, [8, 16, 32, 64, 128], (0.8, 1.3), 3e-2),
    ("flow", "heun", [1.0, 0.75, 0.5, 0.0], 1.0, [8, 16, 32, 64, 128], (1.7, 2.5), 1e-4),
    ("edm", "euler", EDM_T_LIST, 7.0, [16, 32, 64, 128, 256], (0.8, 1.3), 3e-2),
    ("edm", "heun", EDM_T_LIST, 7.0, [16, 32, 64, 128, 256], (1.7, 2.5), 1e-3),
    ("edm", "heun", [2.0, 1.0, 0.0], 1.0, [8, 16, 32, 64, 128], (1.7, 2.5), 1e-3),
])
def test_convergence_order(parameterisation, solver, t_list, rho, step_counts, order, finest):
    """The final state and the states at every t_list entry approach the exact solution, and the
    error falls at the solver's order as the (nested) grid doubles, over four doublings.

    edm with heun takes a plain Euler step into sigma = 0 (euler_at_zero). That does not spoil the
    second order: the exact solution depends on sigma only through sigma^2 (x - mu is proportional
    to sqrt(STD^2 + sigma^2)), so the Euler step from sigma_last to 0 has an error O(sigma_last^2):
    O(h^2) on a uniform grid (the rho=1 case here), and far smaller with Karras spacing, where
    sigma_last = O(steps^-7)."""
    errors = _errors(parameterisation, solver, t_list, rho, step_counts)
    orders = [math.log2(errors[i] / errors[i + 1]) for i in range(len(errors) - 1)]
    assert all(order[0] <= p <= order[1] for p in orders), (errors, orders)
    assert errors[-1] < finest, errors


def test_heun_on_a_non_nested_edm_grid_still_converges():
    # [80, 10, 1, 0]: rounding moves steps between segments as steps double, so no order is claimed;
    # the states at every t_list entry still approach the exact ones
    errors = _errors("edm", "heun", [80.0, 10.0, 1.0, 0.0], 7.0, [32, 128, 512])
    assert errors[0] > 10 * errors[1] > 100 * errors[2]
    assert errors[-1] < 1e-3


@pytest.mark.parametrize("parameterisation, t_list, rho", [("flow", FASTGEN_T_LIST, 1.0),
                                                           ("edm", [80.0, 10.0, 1.0, 0.0], 7.0)])
def test_guidance_follows_the_gaussian_of_the_guided_mean(parameterisation, t_list, rho):
    w = 3.0
    g = torch.Generator().manual_seed(2)
    cond_u = torch.randn(B, 3, 2, generator=g) * 0.1
    cond_c = torch.randn(B, 3, 2, generator=g) + 1.0
    noise = torch.randn(B, 3, 5, generator=g)  # float32, as in production
    mu_u, mu_c = gaussian.cond_mean(cond_u), gaussian.cond_mean(cond_c)
    mu_g = mu_u + w * (mu_c - mu_u)
    model = gaussian.velocity if parameterisation == "flow" else gaussian.denoise

    def guided(x: torch.Tensor, t: float) -> torch.Tensor:
        u, c = model(x, _tb(t, x), cond_u), model(x, _tb(t, x), cond_c)
        return u + w * (c - u)

    # pointwise: the guided field is the field of the Gaussian with mean mu_g
    x = torch.randn(B, 3, 5, generator=g)
    t_mid = t_list[1]
    cond_g = mu_g.reshape(B, 1, 1).expand(B, 3, 2).contiguous()
    torch.testing.assert_close(guided(x, t_mid), model(x, _tb(t_mid, x), cond_g), rtol=0, atol=1e-5)

    deriv = flow_derivative(guided) if parameterisation == "flow" else edm_derivative(guided)
    x_start = start_state(noise, t_list[0], parameterisation)
    exact = gaussian.flow_solution if parameterisation == "flow" else gaussian.edm_solution
    grid, where = time_grid(256, t_list, rho)
    final, kept = solve(deriv, x_start, grid, solver="heun", keep=where[:-1], euler_at_zero=parameterisation == "edm")
    for state, t in zip(kept + [final], t_list):
        torch.testing.assert_close(state, exact(x_start, t_list[0], t, mu_g), rtol=0, atol=1e-3)
    # and not the conditional solution: guidance moved the sample
    assert float((final - exact(x_start, t_list[0], 0.0, mu_c)).abs().min()) > 0.5


# --------------------------------------------------------------------------- solver details


def test_start_state():
    noise = torch.randn(2, 3)
    flow = start_state(noise, 0.999, "flow")
    assert torch.equal(flow, noise) and flow.data_ptr() != noise.data_ptr()
    torch.testing.assert_close(start_state(noise, 80.0, "edm"), noise * 80.0, rtol=0, atol=0)
    with pytest.raises(ValueError, match="'vp' is not one of flow, edm"):
        start_state(noise, 1.0, "vp")
    with pytest.raises(ValueError, match=r"flow t_max 1.5 must lie in \(0, 1\]"):
        start_state(noise, 1.5, "flow")


def _counting(deriv):
    calls = []

    def wrapped(x, t):
        calls.append(t)
        return deriv(x, t)

    return wrapped, calls


@pytest.mark.parametrize("solver, euler_at_zero, grid, expected", [
    ("euler", False, [1.0, 0.5, 0.25, 0.0], 3),
    ("euler", True, [1.0, 0.5, 0.25, 0.0], 3),
    ("heun", False, [1.0, 0.5, 0.25, 0.0], 6),
    ("heun", True, [1.0, 0.5, 0.25, 0.0], 5),
    ("heun", True, [1.0, 0.5, 0.25, 0.1], 6),
])
def test_evaluations_counts_the_derivative_calls(solver, euler_at_zero, grid, expected):
    assert evaluations(solver, grid, euler_at_zero) == expected
    deriv, calls = _counting(lambda x, t: -x)
    solve(deriv, torch.ones(2, 3), grid, solver=solver, euler_at_zero=euler_at_zero)
    assert len(calls) == expected
    assert all(isinstance(t, float) for t in calls)
    assert (0.0 in calls) == (solver == "heun" and not euler_at_zero and grid[-1] == 0.0)


def test_unknown_solver_and_bad_keep():
    with pytest.raises(ValueError, match="solver 'rk4' is not one of euler, heun"):
        solve(lambda x, t: x, torch.ones(1), [1.0, 0.0], solver="rk4")
    with pytest.raises(ValueError, match="solver 'dpm' is not one of euler, heun"):
        evaluations("dpm", [1.0, 0.0], False)
    with pytest.raises(ValueError, match="keep index 3 is outside the grid of 2 times"):
        solve(lambda x, t: x, torch.ones(1), [1.0, 0.0], keep=[3])


def test_edm_heun_needs_euler_at_zero():
    deriv = edm_derivative(lambda x, s: torch.zeros_like(x))
    with pytest.raises(ValueError, match="undefined at sigma = 0.*euler_at_zero=True"):
        solve(deriv, torch.ones(1, 2), [1.0, 0.5, 0.0], solver="heun")
    final, _ = solve(deriv, torch.ones(1, 2), [1.0, 0.5, 0.0], solver="heun", euler_at_zero=True)
    assert torch.isfinite(final).all()


def test_states_stay_float32_with_a_bf16_derivative():
    cond, noise = _setup(3)
    noise = noise.float()
    grid, where = time_grid(16, FASTGEN_T_LIST)
    full = flow_derivative(lambda x, t: gaussian.velocity(x, _tb(t, x), cond))
    half = flow_derivative(lambda x, t: gaussian.velocity(x.bfloat16(), _tb(t, x).bfloat16(), cond))
    ref, ref_kept = solve(full, noise, grid, solver="heun", keep=where)
    for x_start in (noise, noise.bfloat16()):
        final, kept = solve(half, x_start, grid, solver="heun", keep=where)
        assert final.dtype == torch.float32 and all(k.dtype == torch.float32 for k in kept)
        torch.testing.assert_close(final, ref, rtol=0, atol=0.1)
    assert ref.dtype == torch.float32
    final64, _ = solve(full, noise.double(), grid, solver="heun")
    assert final64.dtype == torch.float64
    wide = flow_derivative(lambda x, t: gaussian.velocity(x.double(), _tb(t, x).double(), cond))
    final32, kept32 = solve(wide, noise, grid, solver="heun", keep=where)
    assert final32.dtype == torch.float32 and all(k.dtype == torch.float32 for k in kept32)
