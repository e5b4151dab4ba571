"""Who runs the unit jobs of an output's split. ``local`` (this machine: the build's worker
processes decode, one device encodes, the main process writes and records units) is the only
implementation today; several GPUs and Ray are each one more module here, running the same
:class:`~shardsmith.units.plan.UnitJob` s to the same :class:`~shardsmith.units.job.UnitRecord` s."""
