"""A batch of teacher trajectories: per-sample seeds and noise, classifier-free guidance, the solver.

Contract
- ``sample_seed(base, item_id)``: a sample's own seed, a pure function of the recipe's seed and the
  item's id (never of its position, batch or worker): the same prompt item gets the same noise in
  every run, resumed or not.
- ``make_noise(seed, shape)``: unit-normal float32 noise drawn on the CPU from ``seed`` alone
  (the same bytes on every machine).
- ``Sampler.run(teacher, seeds, cond, mask, negative)``: one :class:`Trajectory` per seed. The ODE
  runs from ``t_list[0]`` (start state: the noise for ``flow``, noise x sigma_max for ``edm``) to 0
  over ``time_grid(steps, t_list, rho)``; ``path`` holds the states at every ``t_list`` entry but
  the last (``path[i]`` is the state at ``t_list[i]``, ``path[0]`` the start state) and ``latent``
  the final sample. With ``guidance != 1`` the conditional and unconditional (``negative``)
  predictions are made in one forward pass and combined as ``u + w (c - u)``. ``pad_to``: a
  shorter batch is padded with zero rows to that size (every forward pass has one shape on a GPU,
  so a sample's result does not depend on its batch-mates). The states are float32 on the CPU.
- A teacher that gives NaN or inf on the batch's samples, or trajectories that hold them, is a
  :class:`~shardsmith.encode.teacher.TeacherError` (exit code 2) naming the teacher and the first time it
  did: nothing of the batch is returned, so no shard holds a non-finite target.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from shardsmith.distill.schedule import time_grid
from shardsmith.distill.solvers import edm_derivative, flow_derivative, solve, start_state


def sample_seed(base: int, item_id: str) -> int:
    """A 63-bit seed from the recipe's seed and the item's id."""
    digest = hashlib.sha256(f"{int(base)}\0{item_id}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") & ((1 << 63) - 1)


def make_noise(seed: int, shape: tuple[int, ...]) -> torch.Tensor:
    g = torch.Generator(device="cpu")
    g.manual_seed(int(seed))
    return torch.randn(tuple(shape), generator=g, dtype=torch.float32)


@dataclass
class Trajectory:
    seed: int
    noise: torch.Tensor  # the unit-normal noise, [*shape]
    path: torch.Tensor  # [len(t_list) - 1, *shape]: the states at t_list[:-1]
    latent: torch.Tensor  # the final sample (t = 0), [*shape]


@dataclass(frozen=True)
class Sampler:
    """The sampling settings of a distill recipe (``parameterisation`` from the teacher)."""

    parameterisation: str  # "flow" | "edm"
    solver: str
    steps: int
    t_list: tuple[float, ...]
    rho: float
    guidance: float
    shape: tuple[int, ...]

    @classmethod
    def from_recipe(cls, recipe) -> "Sampler":
        d, p = recipe.distill, recipe.models.teacher.parameterisation
        rho = d.rho if d.rho is not None else (7.0 if p == "edm" else 1.0)
        return cls(p, d.solver, d.steps, tuple(d.t_list), rho, d.guidance, tuple(d.shape or ()))

    def grid(self) -> tuple[list[float], list[int]]:
        return time_grid(self.steps, self.t_list, self.rho)

    def forward_passes(self) -> int:
        """Teacher forward passes per batch (a guided pass counts once: it runs both halves at once)."""
        from shardsmith.distill.solvers import evaluations

        grid, _ = self.grid()
        return evaluations(self.solver, grid, self.parameterisation == "edm")

    def run(self, teacher, seeds: list[int], cond: torch.Tensor, mask: torch.Tensor | None,
            negative: tuple[torch.Tensor, torch.Tensor | None] | None = None,
            pad_to: int | None = None, shape: tuple[int, ...] | None = None) -> list[Trajectory]:
        """``shape``: the batch's sample shape (default: :attr:`shape`, the recipe's)."""
        n = len(seeds)
        shape = tuple(shape or self.shape)
        if not shape:
            raise ValueError("no sample shape: set distill.shape, or read prompts from a latent_wds source")
        if cond.shape[0] != n:
            raise ValueError(f"{n} seeds but {cond.shape[0]} conditions")
        device = teacher.device
        noise = torch.stack([make_noise(s, shape) for s in seeds])
        rows = max(n, pad_to or 0)
        x_noise, cond, mask = _pad(noise, rows), _pad(cond, rows), None if mask is None else _pad(mask, rows)
        cond = cond.to(device)
        mask = None if mask is None else mask.to(device)
        guided = self.guidance != 1.0
        if guided:
            if negative is None:
                raise ValueError("classifier-free guidance needs the negative prompt's embedding")
            neg, neg_mask = negative
            cond_in = torch.cat([neg.to(device).expand(rows, *neg.shape).to(cond.dtype), cond])
            mask_in = None if mask is None or neg_mask is None else torch.cat(
                [neg_mask.to(device).expand(rows, *neg_mask.shape).to(mask.dtype), mask])
        w = float(self.guidance)
        # (t, whether the teacher's output on the batch's own rows was finite): device flags, read once at the end
        finite: list[tuple[float, torch.Tensor]] = []

        def predict(x: torch.Tensor, t: float) -> torch.Tensor:
            if not guided:
                out = teacher.predict(x, t, cond, mask)
                finite.append((t, torch.isfinite(out[:n]).all()))
                return out
            both = teacher.predict(torch.cat([x, x]), t, cond_in, mask_in)
            u, c = both[:rows], both[rows:]
            finite.append((t, torch.isfinite(u[:n]).all() & torch.isfinite(c[:n]).all()))
            return u + w * (c - u)

        deriv = flow_derivative(predict) if self.parameterisation == "flow" else edm_derivative(predict)
        grid, where = self.grid()
        x0 = start_state(x_noise.to(device), self.t_list[0], self.parameterisation)
        final, kept = solve(deriv, x0, grid, solver=self.solver, keep=where[:-1],
                            euler_at_zero=self.parameterisation == "edm")
        path = torch.stack(kept, dim=1)[:n].float().cpu()
        final = final[:n].float().cpu()
        _check_finite(teacher, finite, path, final, self.guidance)
        return [Trajectory(seed, noise[i].clone(), path[i].clone(), final[i].clone()) for i, seed in enumerate(seeds)]


def _check_finite(teacher, finite: list[tuple[float, torch.Tensor]], path: torch.Tensor, final: torch.Tensor,
                  guidance: float) -> None:
    """A :class:`~shardsmith.encode.teacher.TeacherError` naming the teacher when it gave NaN or inf on the batch's
    own rows (padding rows may: a zero mask) or its trajectories hold them: nothing of the batch is returned, so no
    shard holds them (the flags are read after the states came to the CPU: no extra wait on a GPU)."""
    from shardsmith.encode.teacher import TeacherError

    flags = torch.stack([f for _, f in finite]).cpu() if finite else torch.ones(0, dtype=torch.bool)
    if bool(flags.all()) and bool(torch.isfinite(path).all()) and bool(torch.isfinite(final).all()):
        return
    name = getattr(teacher, "name", None) or getattr(getattr(teacher, "spec", None), "family", "the teacher")
    bad = [(i, t) for i, ((t, _), ok) in enumerate(zip(finite, flags.tolist())) if not ok]
    if bad:
        first = f"NaN or inf at t = {bad[0][1]:g} (its call {bad[0][0] + 1} of {len(finite)} on this batch)"
    else:
        first = (f"finite outputs, but the trajectory overflowed to NaN or inf (distill.guidance {guidance:g} "
                 "amplifies them: u + w (c - u))")
    raise TeacherError(f"models.teacher ({name}) gave {first}: a distillation target must be finite, so the run "
                       "stops before this batch is written. Check the teacher: its weights, its dtype (float16 "
                       "overflows: use bfloat16 or float32), and what it returns for these inputs; then build again")


def _pad(t: torch.Tensor, rows: int) -> torch.Tensor:
    if t.shape[0] >= rows:
        return t
    return torch.cat([t, t.new_zeros((rows - t.shape[0], *t.shape[1:]))])
