"""Verification of produced datasets: inspect, repair and loader-contract checks."""
