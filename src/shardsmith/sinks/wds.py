"""WebDataset sink: ``NNNNN.tar`` shards in one folder plus ``shard_count.json``.

A unit of work is one shard. A shard closes when it holds ``samples_per_shard`` samples or
when the next sample would push it past ``max_shard_bytes`` (a single larger sample gets a
shard of its own). Shards are written atomically; the caller commits them to the ledger. A unit
that writes no sample writes no shard, and ``drop_unit`` removes the one an earlier, uncommitted
attempt of it left (a resume whose items of that unit now all fail). ``drop_units_after`` removes
the shards numbered past the last committed unit that an earlier, uncommitted attempt left (an
output cut by bytes, whose resume cuts fewer units because items now fail), each only when every
sample in it is an item of the build's plan.
"""

from __future__ import annotations

import tarfile
from collections.abc import Callable
from pathlib import Path

from shardsmith.formats.tar import END_BYTES, tar_members
from shardsmith.formats.wds import (SHARD_COUNT_FILE, group_members, member_name, sample_tar_bytes, shard_index,
                                    shard_name)
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

    def drop_units_after(self, seq: int, planned: Callable[[list[str]], bool]) -> list[str]:
        """Remove the shards ``NNNNN.tar`` numbered past ``seq`` (the last committed unit) whose sample keys
        are all items of the build's plan (``planned(keys)``): an earlier, uncommitted attempt of units a
        resume no longer cuts left them. Any other file stays (verify names it). The names removed."""
        gone = []
        for path in sorted(self.dest.iterdir()) if self.dest.is_dir() else []:
            try:
                if shard_index(path.name) <= seq or not path.is_file() or path.is_symlink():
                    continue
                keys = [k for k, _ in group_members(tar_members(path))]
            except (ValueError, OSError, tarfile.TarError):  # not a shard name; a file that is no tar
                continue
            if keys and planned(keys):
                path.unlink()
                gone.append(path.name)
        if gone:
            fsync_dir(self.dest)
        return gone

    def finalize(self, units: list[dict]) -> dict:
        """Write ``shard_count.json``; return the output's manifest block."""
        counts = {u["name"]: u["count"] for u in units if u["count"] > 0}
        self.dest.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.dest / SHARD_COUNT_FILE, counts)
        return {"dir": str(self.dest), "shards": [
            {"name": u["name"], "count": u["count"], "bytes": u["bytes"], "sha256": u["sha256"]}
            for u in units if u["count"] > 0]}
