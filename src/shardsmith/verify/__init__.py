"""Verification of produced datasets: inspect, repair and loader-contract checks."""


from shardsmith.api import callable_module  # noqa: E402 - after the module's own names

callable_module(__name__, "verify")  # shardsmith.verify(...) is shardsmith.api.verify
