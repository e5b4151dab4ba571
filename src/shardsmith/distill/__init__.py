"""Knowledge-distillation data: teacher trajectories (time grids, ODE solvers, teachers).

``shardsmith.distill(recipe, out)`` is :func:`shardsmith.api.distill` (this package, called, runs it).
"""

from shardsmith.api import callable_module

callable_module(__name__, "distill")
