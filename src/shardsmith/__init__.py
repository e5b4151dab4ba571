"""shardsmith: compile raw media into training-ready datasets and prove they load.

The Python API (:mod:`shardsmith.api`), loaded on first use so that ``import shardsmith`` stays
light (no torch):

- ``shardsmith.build(recipe, out)`` -> :class:`~shardsmith.api.BuildResult`
- ``shardsmith.distill(recipe, out)`` -> :class:`~shardsmith.api.BuildResult` (teacher pairs and trajectories)
- ``shardsmith.scan(recipe)`` -> :class:`~shardsmith.api.ScanResult`
- ``shardsmith.verify(dataset, preset=...)`` -> :class:`~shardsmith.api.VerifyResult`
- ``shardsmith.inspect(dataset)`` -> :class:`~shardsmith.api.InspectResult`
- ``shardsmith.repair(dataset)`` -> :class:`~shardsmith.api.RepairResult`

``build``, ``distill``, ``scan`` and ``verify`` are also the modules of those names; calling one calls the API
function.
"""

__version__ = "0.1.0"

_MODULES = ("build", "distill", "scan", "verify")  # modules that, called, are the API function of their name
_API = ("inspect", "repair", "BuildResult", "ScanResult", "VerifyResult", "InspectResult", "RepairResult",
        "OutputResult", "Counts", "Check")
__all__ = [*_MODULES, *_API, "__version__"]


def __getattr__(name: str):
    import importlib

    if name in _MODULES:
        return importlib.import_module(f"shardsmith.{name}")
    if name in _API:
        return getattr(importlib.import_module("shardsmith.api"), name)
    raise AttributeError(f"module 'shardsmith' has no attribute {name!r}")
