"""WebDataset sink: ``NNNNN.tar`` shards in one folder plus ``shard_count.json``.

A unit of work is one shard. A shard closes when it holds ``samples_per_shard`` samples or
when the next sample would push it past ``max_shard_bytes`` (a single larger sample gets a
shard of its own). Shards are written atomically; the caller commits them to the ledger. A unit
that writes no sample writes no shard, and ``drop_unit`` removes the one an earlier, uncommitted
attempt of it left (a resume whose items of that unit now all fail).
"""

from __future__ import annotations

from pathlib import Path

from shardsmith.formats.tar import END_BYTES
from shardsmith.formats.wds import SHARD_COUNT_FILE, member_name, sample_tar_bytes, shard_name
from shardsmith.recipe import WdsOutput
from shardsmith.records import SampleResult
from shardsmith.atomic import atomic_open, atomic_write_json, fsync_dir
from shardsmith.sinks.tar import DeterministicTar, HashingWriter


class WdsSink:
    kind = "wds"

    def __init__(self, output: WdsOutput, dest: Path):
        self.o, self.dest = output, dest

    def unit_full(self, count: int, nbytes: int, next_sample: SampleResult, key: str,
                  next_bytes: int | None = None) -> bool:
        """Should the current shard close before ``next_sample`` is added? ``nbytes``: the shard's
        samples so far; ``next_bytes``: the next sample's (default: from its members)."""
        if count >= self.o.samples_per_shard:
            return True
        limit = getattr(self.o, "max_shard_bytes", None)
        if limit is not None and count > 0:
            if next_bytes is None:
                next_bytes = sample_tar_bytes(next_sample.members or {}, key)
            return nbytes + next_bytes + END_BYTES > limit
        return False

    def write_unit(self, seq: int, samples: list[tuple[str, SampleResult]]) -> tuple[str, int, str]:
        """Write shard ``seq`` atomically; returns (name, bytes, sha256)."""
        name = shard_name(seq)
        with atomic_open(self.dest / name) as f:
            out = HashingWriter(f)  # hashed as written: the shard is never read back
            try:
                tar = DeterministicTar(out)
                for key, s in samples:
                    for suffix, data in s.members.items():
                        tar.add(member_name(key, suffix), data)
                tar.close()
            finally:
                out.close()
        return name, out.size, out.hexdigest()

    def drop_unit(self, seq: int) -> None:
        """Unit ``seq`` writes no sample: remove its shard if an earlier, uncommitted attempt left one
        (the ledger never recorded it; a loader globbing ``*.tar`` would read it)."""
        path = self.dest / shard_name(seq)
        if path.is_file() or path.is_symlink():
            path.unlink()
            fsync_dir(path.parent)

    def finalize(self, units: list[dict]) -> dict:
        """Write ``shard_count.json``; return the output's manifest block."""
        counts = {u["name"]: u["count"] for u in units if u["count"] > 0}
        self.dest.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.dest / SHARD_COUNT_FILE, counts)
        return {"dir": str(self.dest), "shards": [
            {"name": u["name"], "count": u["count"], "bytes": u["bytes"], "sha256": u["sha256"]}
            for u in units if u["count"] > 0]}
