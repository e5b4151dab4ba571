"""shardsmith: compile raw media into training-ready datasets and prove they load."""

__version__ = "0.1.0"
