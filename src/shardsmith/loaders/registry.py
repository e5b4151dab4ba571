"""Data-config registry: named datasets in a YAML file, with paths through an environment root.

An entry looks like::

    quickstart:
      preset: image
      path: ${DATA_ROOT_DIR}/quickstart/wds
      overrides: {batch_size: 16}

so the file moves between machines: only ``DATA_ROOT_DIR`` changes. The file is
``--config``, else ``$SHARDSMITH_DATA_CONFIG``, else ``~/.config/shardsmith/data.yaml``.
Writes are atomic and never drop other entries; re-registering a name with a different
entry is refused unless ``replace``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from shardsmith.atomic import atomic_write_bytes

DEFAULT_ENV = "DATA_ROOT_DIR"


class RegistryError(ValueError):
    """A bad name, a clash with an existing entry, or an unresolvable path."""


def config_path(explicit: str | os.PathLike | None = None) -> Path:
    if explicit:
        return Path(explicit)
    env = os.environ.get("SHARDSMITH_DATA_CONFIG")
    return Path(env) if env else Path.home() / ".config" / "shardsmith" / "data.yaml"


def read_config(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise RegistryError(f"{path} must hold a mapping of dataset names to entries")
    return data


def portable_path(dataset: Path, root_env: str = DEFAULT_ENV) -> tuple[str, str]:
    """(path written in the config, root value): ``${ENV}/rel`` under the env root.

    When the variable is unset, the dataset's parent folder becomes the root and the caller
    should tell the user to export it.
    """
    dataset = dataset.resolve()
    root = os.environ.get(root_env)
    root_path = Path(root).resolve() if root else dataset.parent
    if not dataset.is_relative_to(root_path):
        raise RegistryError(f"{dataset} is not under ${root_env}={root_path}; move it there or set {root_env} "
                            "to a folder that contains it")
    rel = dataset.relative_to(root_path).as_posix()
    return (f"${{{root_env}}}/{rel}" if rel != "." else f"${{{root_env}}}"), str(root_path)


def resolve(path: str) -> Path:
    expanded = os.path.expandvars(path)
    if "$" in expanded:
        raise RegistryError(f"{path!r} names an environment variable that is not set; export it first")
    return Path(expanded)


def add_entry(path: Path, name: str, entry: dict[str, Any], *, replace: bool = False) -> None:
    if not name or not all(c.isalnum() or c in "_-" for c in name):
        raise RegistryError(f"dataset name {name!r} must be letters, digits, '_' or '-'")
    data = read_config(path)
    if name in data and data[name] != entry and not replace:
        raise RegistryError(f"{path} already has a different entry {name!r}: {data[name]}; "
                            "choose another --name or pass --replace")
    data[name] = entry
    atomic_write_bytes(path, yaml.safe_dump(data, sort_keys=True, allow_unicode=True).encode("utf-8"))


def get_entry(name: str, path: Path) -> dict[str, Any]:
    data = read_config(path)
    if name not in data:
        raise RegistryError(f"no dataset {name!r} in {path} (known: {sorted(data)}); "
                            "add it with `shardsmith register DATASET --preset P --name NAME`")
    return data[name]
