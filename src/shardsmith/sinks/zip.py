"""Class-conditional ZIP sink in the EDM ``dataset_tool`` layout.

Units of ``output.unit`` images are staged as deterministic tars under the build's state folder,
each numbering its images from 0 (units may be written in any order); ``finalize`` copies them,
in unit order, into an uncompressed ZIP under their final names ``00000/img00000000.png``, with
fixed timestamps, writes ``dataset.json``, then renames the ZIP into place. Re-running finalize
gives the same bytes. :class:`LatentZipSink` is the same with one ``.npy`` latent per sample
(members ``00000/img-mean-std-00000000.npy``, as EDM2 / FastGen's latent ZIPs).
"""

from __future__ import annotations

import hashlib
import tarfile
import zipfile
from pathlib import Path

from shardsmith.formats.wds import PNG
from shardsmith.formats.zip import (LATENT_MEMBER, ZIP_LABELS_FILE, labels_document, latent_zip_member_name, zip_entry,
                                    zip_member_name)
from shardsmith.recipe import ZipOutput
from shardsmith.records import SampleResult
from shardsmith.atomic import atomic_open
from shardsmith.sinks.tar import DeterministicTar

class ZipSink:
    kind = "zip"
    member = PNG  # the sample member (``res.members`` key) each image is
    name_of = staticmethod(zip_member_name)  # image index -> its member name in the ZIP

    def __init__(self, output: ZipOutput, dest: Path, stage: Path, labelled: bool):
        self.o, self.dest, self.stage, self.labelled = output, dest, stage, labelled

    def unit_full(self, count: int, nbytes: int, next_sample: SampleResult, key: str,
                  next_bytes: int | None = None) -> bool:
        return count >= self.o.unit

    def write_unit(self, seq: int, samples: list[tuple[str, SampleResult]]) -> tuple[str, int, str]:
        name = f"{seq:05d}.stage.tar"
        path = self.stage / name
        with atomic_open(path) as f:
            tar = DeterministicTar(f)
            for i, (_key, s) in enumerate(samples):  # numbered within the unit; finalize numbers them all
                tar.add(self.name_of(i), s.members[self.member])
            tar.close()
        return name, path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest()

    def finalize(self, units: list[dict], labels: list[int | None]) -> dict:
        """Assemble the ZIP from staged units; ``labels`` are the written images' labels in order."""
        index = 0
        label_rows = []
        with atomic_open(self.dest) as f:
            with zipfile.ZipFile(f, mode="w", compression=zipfile.ZIP_STORED) as zf:
                for u in units:
                    if u["count"] == 0:
                        continue
                    with tarfile.open(self.stage / u["name"]) as tar:
                        for i, m in enumerate(tar):
                            if m.name != self.name_of(i) or i >= u["count"]:
                                raise RuntimeError(f"staged unit {u['name']} does not hold images 0..{u['count'] - 1} "
                                                   f"in order (found {m.name}); re-run with --overwrite")
                            name = self.name_of(index)
                            zf.writestr(zip_entry(name), tar.extractfile(m).read())
                            label_rows.append([name, labels[index]])
                            index += 1
                zf.writestr(zip_entry(ZIP_LABELS_FILE), labels_document(label_rows if self.labelled else None))
        h = hashlib.sha256()
        with open(self.dest, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        w, hh = self.o.size
        out_w, out_h = (w, w) if self.o.transform == "center-crop-wide" else (w, hh)
        return {"path": str(self.dest), "images": index, "bytes": self.dest.stat().st_size, "sha256": h.hexdigest(),
                "resolution": [out_w, out_h], "transform": self.o.transform, "labelled": self.labelled}


class LatentZipSink(ZipSink):
    """A ``latent_zip``: each sample's ``npy`` member (rendered from the encoder's output) under
    ``{idx[:5]}/img-mean-std-{idx:08d}.npy``; staging, numbering and labels as :class:`ZipSink`."""

    kind = "latent_zip"
    member = LATENT_MEMBER
    name_of = staticmethod(latent_zip_member_name)
