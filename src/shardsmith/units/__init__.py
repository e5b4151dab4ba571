"""Units of work: the unit plan (which items each unit holds, known before any item is
transformed or encoded) and the unit job (a picklable description a worker runs to one
:class:`~shardsmith.units.job.UnitRecord`)."""
