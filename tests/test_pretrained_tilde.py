"""``models.text.pretrained: ~/models/x`` (an LTX-2 folder) in the scan's latent size estimate: the folder's
``connectors/config.json`` gives the embedding width, as the build loads it (``~`` expanded:
``precheck.local_path``); it was looked up as a hub id and the estimate said the model has no config on disk."""

from __future__ import annotations

import json

from shardsmith.recipe import TextModel, VaeModel
from shardsmith.scan.latent_size import text_shape, vae_shape


def test_tilde_pretrained_is_read_from_the_home_folder(tmp_path, monkeypatch):
    home = tmp_path / "home"
    conn = home / "models" / "x" / "connectors"
    conn.mkdir(parents=True)
    (conn / "config.json").write_text(json.dumps(
        {"per_modality_projections": True, "video_hidden_dim": 1536, "audio_hidden_dim": 768}), encoding="utf-8")
    vae = home / "models" / "v"
    vae.mkdir(parents=True)
    (vae / "config.json").write_text(json.dumps(
        {"_class_name": "AutoencoderKL", "latent_channels": 4, "block_out_channels": [32, 64, 64, 64]}),
        encoding="utf-8")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)  # no ./~ folder here: only the expansion finds it

    assert text_shape(TextModel(family="ltx2", pretrained="~/models/x", max_length=256)) == (256, 1536)
    # the VAE beside it was already read from the expanded path: the two agree
    got = vae_shape(VaeModel(family="sd", pretrained="~/models/v"))
    assert isinstance(got, dict) and got["channels"] == 4 and got["spatial"] == 8, got

    # a ~ path that is not there still says so, naming the path as written
    missing = text_shape(TextModel(family="ltx2", pretrained="~/models/nothing", max_length=256))
    assert isinstance(missing, str) and "'~/models/nothing'" in missing and "connectors/config.json" in missing
