"""Issue 16: the LTX-2 trainer's preprocessing habits on the command line.

`shardsmith build DATASET.{csv,json,jsonl} --out OUT` takes the table as its source; the flags of
LTX-2's `packages/ltx-trainer/scripts/process_dataset.py` mean what they mean there:
`--resolution-buckets "WxHxF;WxHxF"` (width x height x frames, `;`-separated, as its
`parse_resolution_buckets`), `--caption-column`, `--video-column` (and `--media-column`),
`--lora-trigger` (prepended as `process_captions.py` does: `f"{trigger.strip()} " + caption`),
`--device cuda:N`. CSV metadata cells that spell numbers stay numbers.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from media_factory import real_photos, write_table
from shardsmith import cli

PY = sys.executable


def invoke(*args) -> tuple[int, str]:
    r = CliRunner().invoke(cli.app, [str(a) for a in args])
    return r.exit_code, r.output


def run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "shardsmith", *map(str, args)], capture_output=True, text=True)


def samples(folder: Path) -> dict[str, dict[str, bytes]]:
    """key -> suffix -> bytes of every sample in the folder's shards (and its bucket folders')."""
    out: dict[str, dict[str, bytes]] = {}
    for shard in sorted(folder.rglob("*.tar")):
        with tarfile.open(shard) as t:
            for m in t.getmembers():
                key, _, suffix = m.name.partition(".")
                out.setdefault(key, {})[suffix] = t.extractfile(m).read()
    return out


def ltx_table(root: Path, fmt: str, n: int = 3) -> tuple[Path, list[dict]]:
    """A table as the LTX trainer's docs write one (`media_path`-style column of its own name, a
    caption column not called caption) plus metadata columns of numbers and codes."""
    photos = real_photos(root / "clips", n, seed=3, min_side=60, max_side=120)
    rows = [{"file_loc": f"clips/{p.name}", "desc": f"a photo numbered {i}", "score": i + 0.5, "frames": 10 * i,
             "code": "007"} for i, p in enumerate(photos)]
    if fmt == "csv":
        rows = [{k: str(v) for k, v in r.items()} for r in rows]
    return write_table(root, rows, fmt), rows


@pytest.mark.parametrize("fmt", ["csv", "json", "jsonl"])
def test_a_dataset_file_is_built_as_its_source(tmp_path, fmt):
    table, rows = ltx_table(tmp_path / "data", fmt)
    out = tmp_path / "out"
    code, output = invoke("build", table, "--out", out, "--video-column", "file_loc", "--caption-column", "desc",
                          "--quiet", "--workers", "1")
    assert code == 0, output
    got = samples(out / "wds")
    assert len(got) == len(rows)
    captions = sorted(s["txt"].decode() for s in got.values())
    assert captions == sorted(r["desc"] for r in rows)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["sources"][0]["kind"] == "table" and manifest["counts"]["written"] == len(rows)


def test_media_column_is_the_same_flag_as_video_column(tmp_path):
    table, rows = ltx_table(tmp_path / "data", "jsonl")
    out = tmp_path / "out"
    code, output = invoke("build", table, "--out", out, "--media-column", "file_loc", "--caption-column", "desc",
                          "--quiet", "--workers", "1")
    assert code == 0, output
    assert len(samples(out / "wds")) == len(rows)
    code, output = invoke("build", table, "--out", tmp_path / "o2", "--media-column", "file_loc",
                          "--video-column", "desc")
    assert code == 2 and "name the same role" in output and "Traceback" not in output


def test_column_flags_that_name_no_column_are_one_message(tmp_path):
    table, _ = ltx_table(tmp_path / "data", "csv")
    code, output = invoke("build", table, "--out", tmp_path / "o", "--video-column", "video")
    assert code == 2 and "column 'video'" in output and "'file_loc'" in output, output
    code, output = invoke("build", table, "--out", tmp_path / "o", "--video-column", "file_loc", "--quiet")
    assert code == 0, output  # the corrected command runs in the same --out


def test_csv_metadata_keeps_numbers(tmp_path):
    table, rows = ltx_table(tmp_path / "data", "csv")
    out = tmp_path / "out"
    code, output = invoke("build", "--source", table, "--to", "wds", "--out", out, "--columns",
                          "media=file_loc,caption=desc", "--quiet", "--workers", "1")
    assert code == 0, output
    metas = sorted((json.loads(s["json"])["meta"] for s in samples(out / "wds").values()),
                   key=lambda m: m["frames"])
    assert [m["frames"] for m in metas] == [0, 10, 20]  # ints, not "0", "10", "20"
    assert [m["score"] for m in metas] == [0.5, 1.5, 2.5]
    assert all(m["code"] == "007" for m in metas)  # a leading zero is text, kept as written


def test_lora_trigger_is_prepended_to_every_caption_and_recorded(tmp_path):
    table, rows = ltx_table(tmp_path / "data", "json")
    out = tmp_path / "out"
    code, output = invoke("build", table, "--out", out, "--video-column", "file_loc", "--caption-column", "desc",
                          "--lora-trigger", "  MYTRIGGER ", "--quiet", "--workers", "1")
    assert code == 0, output
    captions = sorted(s["txt"].decode() for s in samples(out / "wds").values())
    # exactly process_captions.py's f"{lora_trigger.strip()} " + caption
    assert captions == sorted(f"MYTRIGGER {r['desc']}" for r in rows)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["lora_trigger"] == "  MYTRIGGER " and manifest["recipe"]["lora_trigger"] == "  MYTRIGGER "


def test_an_empty_lora_trigger_is_refused(tmp_path):
    table, _ = ltx_table(tmp_path / "data", "json")
    code, output = invoke("build", table, "--out", tmp_path / "o", "--video-column", "file_loc", "--lora-trigger", " ")
    assert code == 2 and "lora_trigger is empty" in output, output


def test_resolution_buckets_are_ltx_strings(tmp_path):
    """`--resolution-buckets "768x448x89;512x512x49"` is geometry.buckets: W x H x F, ';'-separated."""
    recipe = cli._recipe(None, [str(tmp_path)], {"resolution_buckets": "768x448x89; 512x512x49"}, ["latent_wds"],
                         ["models.vae.family=ltx"], "<test>")
    assert recipe.geometry.buckets == ["768x448x89", "512x512x49"]
    for bad in ("768x448", "768x448x89;;512x512x49", "768x448x89,512x512x49"):
        code, output = invoke("build", "--source", tmp_path, "--to", "latent_wds", "--resolution-buckets", bad,
                              "--out", tmp_path / "o")
        assert code == 2 and "--resolution-buckets" in output and "768x448x89;512x512x49" in output, output
        assert "Traceback" not in output


def test_resolution_buckets_are_checked_against_the_vae(tmp_path):
    table, _ = ltx_table(tmp_path / "data", "json")
    r = run("build", table, "--to", "latent_wds", "--resolution-buckets", "500x512x49", "--set",
            "models.vae.family=ltx", "--out", tmp_path / "o")
    assert r.returncode == 2 and "bucket 500x512x49" in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda:0", "cuda:3"])
def test_device_cuda_n_without_a_gpu_is_one_message(tmp_path, device):
    table, _ = ltx_table(tmp_path / "data", "json")
    code, output = invoke("build", table, "--video-column", "file_loc", "--device", device, "--out", tmp_path / "o")
    assert code == 2, output
    assert f"--device is {device}" in output and "sees no CUDA device" in output and "Traceback" not in output
    assert not (tmp_path / "o").exists()


def test_device_cuda_n_beyond_the_visible_gpus_names_them(monkeypatch):
    from shardsmith.precheck import DeviceError, resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1", "--device") == "cuda:1"
    with pytest.raises(DeviceError, match=r"cuda:2, but torch sees 2 CUDA device\(s\) here \(cuda:0 to cuda:1"):
        resolve_device("cuda:2", "--device")


def test_device_flag_spellings(tmp_path):
    code, output = invoke("build", "--source", tmp_path, "--to", "wds", "--device", "gpu1", "--out", tmp_path / "o")
    assert code == 2 and "use auto, cuda, cuda:N" in output, output
    recipe = cli._recipe(None, [str(tmp_path)], {"device": "cpu"}, ["wds"], [], "<test>")
    assert recipe.models.device == "cpu"
    data = {"sources": [{"path": str(tmp_path)}], "outputs": [{"format": "wds"}], "models": {"device": "cuda:1"}}
    from shardsmith.recipe import recipe_from_dict

    assert recipe_from_dict(data).models.device == "cuda:1"
    with pytest.raises(Exception, match="cuda:N for visible GPU N"):
        recipe_from_dict({**data, "models": {"device": "cuda1"}})


def test_the_stage_places_models_on_cuda_n_and_binds_its_threads(monkeypatch):
    """`cuda:N` reaches the models' placement; the stage keeps `device == "cuda"` for its own
    decisions and makes GPU N current in each thread that queues work (streams and events are per
    device). Checked on a real 2-GPU machine too (see the issue note)."""
    from shardsmith.encode import stage as stage_mod
    from shardsmith.recipe import recipe_from_dict

    placed, current = [], []
    monkeypatch.setattr(stage_mod, "resolve_device", lambda d, by: d)
    monkeypatch.setattr(stage_mod, "load_vae", lambda *a, device, **k: placed.append(("vae", device)) or _FakeVae())
    monkeypatch.setattr(stage_mod, "load_text_encoder", lambda *a, device, **k: placed.append(("text", device)))
    monkeypatch.setattr(stage_mod, "validate_buckets", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: current.append(i))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[-1] if current else 0)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", torch.backends.cudnn.benchmark)
    switch = sys.getswitchinterval()
    try:
        recipe = recipe_from_dict({"sources": [{"path": "x"}], "outputs": [{"format": "latent_wds"}],
                                   "geometry": {"buckets": ["64x64x1"]},
                                   "models": {"vae": {"family": "sd"}, "text": {"family": "minilm"},
                                              "device": "cuda:1"}})
        st = stage_mod.EncodeStage.from_recipe(recipe)
    finally:
        sys.setswitchinterval(switch)
    assert placed == [("vae", "cuda:1"), ("text", "cuda:1")]
    assert st.device == "cuda" and st.device_index == 1 and current == [1]
    current.clear()
    st.bind_device()
    assert current == [1]


class _FakeVae:
    class spec:
        kind, spatial, temporal = "image_vae", 8, 1


@pytest.mark.slow
def test_lora_trigger_reaches_the_text_encoder_and_the_cache_stamp(tmp_path):
    """A build with `--lora-trigger T` encodes exactly what a build whose captions already start
    with "T " encodes; the `.precomputed/` stamp records the trigger."""
    table, rows = ltx_table(tmp_path / "data", "jsonl", n=2)
    baked = write_table(tmp_path / "baked", [{**r, "desc": f"TRIG {r['desc']}"} for r in rows], "jsonl")
    shutil.copytree(tmp_path / "data" / "clips", tmp_path / "baked" / "clips")
    common = ["--to", "latent_wds", "--to", "precomputed", "--resolution-buckets", "64x64x1", "--video-column",
              "file_loc", "--caption-column", "desc", "--set", "models.vae.family=sd", "--set",
              "models.text.family=minilm", "--set", "outputs[0].samples_per_shard=10", "--quiet", "--workers", "1"]
    a = run("build", table, "--out", tmp_path / "a", "--lora-trigger", "TRIG", *common)
    assert a.returncode == 0, a.stderr
    b = run("build", "--source", baked, "--out", tmp_path / "b", *common)
    assert b.returncode == 0, b.stderr
    sa, sb = samples(tmp_path / "a" / "latents"), samples(tmp_path / "b" / "latents")
    assert len(sa) == len(rows)
    emb_a = sorted(s["txt_emb.pth"] for s in sa.values())
    emb_b = sorted(s["txt_emb.pth"] for s in sb.values())
    assert emb_a == emb_b
    stamp = json.loads((tmp_path / "a" / ".precomputed" / "shardsmith.json").read_text())
    assert stamp["lora_trigger"] == "TRIG"
    assert "lora_trigger" not in json.loads((tmp_path / "b" / ".precomputed" / "shardsmith.json").read_text())


def test_a_large_dataset_file_is_not_parsed_as_a_recipe_first(tmp_path, monkeypatch):
    """A table past a recipe's size is taken for a table at once (YAML parsed a 22 MB CSV for 17 s before the
    build began); a small one is still read as a recipe where it is one."""
    from shardsmith import cli

    big = tmp_path / "big.csv"
    big.write_text("file,caption\n" + "clips/a.jpg,a photo of a cat on a mat\n" * 30_000)  # ~1.2 MB
    small = tmp_path / "recipe.json"
    small.write_text(json.dumps({"sources": [{"path": "clips"}], "outputs": [{"format": "wds"}]}))
    read = []
    real = cli._read_recipe_file
    monkeypatch.setattr(cli, "_read_recipe_file", lambda p: (read.append(p.name), real(p))[1])
    assert cli._dataset_file(big) is True and read == []
    assert cli._dataset_file(small) is False and read == ["recipe.json"]
