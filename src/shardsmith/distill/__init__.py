"""Knowledge-distillation data: teacher trajectories (time grids, ODE solvers, teachers)."""
