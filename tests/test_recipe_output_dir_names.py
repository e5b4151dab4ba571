"""An output ``dir`` / ``path`` that makes a folder named like a dataset's own file is refused when the recipe is read.

Before: ``--set outputs[0].dir=shard_count.json`` built (exit 0), but the build folder, holding an entry named
``shard_count.json``, was taken for a WebDataset dataset: its HTML report could never be written, and the advised
``shardsmith report OUT`` failed the same way. Now such a name (an index file, the .precomputed/ stamp, a ``.tar``
shard, at any depth) is one recipe error naming the output and a name to use instead, exit 2, nothing written.
"""

from __future__ import annotations

import pytest

from shardsmith.recipe import RecipeError, recipe_from_dict
from test_cli_mistakes import assert_message, folder, invoke  # noqa: F401 (folder: a fixture)


def test_an_output_dir_named_like_an_index_file_is_refused(folder, tmp_path):
    code, out = invoke("build", "--source", folder, "--to", "wds", "--out", tmp_path / "fz",
                       "--set", "outputs[0].dir=shard_count.json")
    assert_message(code, out, "output 'wds': 'shard_count.json' makes a folder named 'shard_count.json', the name "
                              "of a dataset's index file: the folder holding it would be taken for a dataset (by "
                              "verify, inspect and the build's report, which could then never be written); choose "
                              "another dir/path for this output, e.g. 'shard_count_data'")
    assert not (tmp_path / "fz").exists()


@pytest.mark.parametrize("output, says", [
    ({"format": "wds", "dir": "ignore_index.json"}, "'ignore_index.json', the name of a dataset's index file"),
    ({"format": "wds", "dir": "repair.json"}, "'repair.json', the name of a dataset's index file"),
    ({"format": "wds", "dir": "buckets.json"}, "'buckets.json', the name of a dataset's index file"),
    ({"format": "wds", "dir": "out/shardsmith.json"}, "'shardsmith.json', the name of a .precomputed/ tree's stamp"),
    ({"format": "wds", "dir": "00000.tar"}, "'00000.tar', the name of a WebDataset shard (.tar)"),
    ({"format": "zip", "path": "index.json/d.zip", "resolution": 32}, "e.g. 'index_data/d.zip'"),
])
def test_every_dataset_file_name_is_refused_at_any_depth(folder, output, says):
    with pytest.raises(RecipeError) as e:
        recipe_from_dict({"sources": [{"path": str(folder)}], "outputs": [output]})
    assert says in str(e.value), str(e.value)


def test_ordinary_names_still_pass(folder):
    r = recipe_from_dict({"sources": [{"path": str(folder)}],
                          "outputs": [{"format": "wds", "dir": "shards.d/json"},
                                      {"format": "zip", "path": "tar/data.zip", "resolution": 32}]})
    assert [o.dir if o.format == "wds" else o.path for o in r.outputs] == ["shards.d/json", "tar/data.zip"]
