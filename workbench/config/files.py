"""A run's settings as a file — what `workbench run --config FILE` loads and `--print-config` writes.

    dp: 2
    model: {base: small, layers: 8}       # or a preset's name
    precision: bf16

YAML (`.yaml`, `.yml`) or TOML (`.toml`): the keys are RunConfig's fields, every one optional (the rest keep
their defaults); a model given by its dims loads as the same ModelConfig. `config_text` writes every field
of a RunConfig as YAML, so a file written and read back is the same RunConfig (tests/test_config_files.py).
An unknown key or a bad value is a ConfigError naming it, as on the command line.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import yaml

from workbench.config.model_config import ConfigError
from workbench.config.run_config import RunConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

FORMATS = (".yaml", ".yml", ".toml")


def read_settings(path: str) -> dict[str, Any]:
    """The file's settings as a dict (RunConfig's field names)."""
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path!r}: no such file")
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in FORMATS:
        raise ConfigError(
            f"config file {path!r}: valid formats are YAML ({FORMATS[0]}, {FORMATS[1]}) and TOML "
            f"({FORMATS[2]})"
        )
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f) if suffix == ".toml" else yaml.safe_load(f)
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"config file {path!r} does not parse: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {path!r}: expected a mapping of RunConfig's fields, "
            f"found {type(data).__name__}"
        )
    return data


def read_config(path: str) -> RunConfig:
    """The RunConfig a file describes (not yet validated: flags may change it first)."""
    return RunConfig.from_dict(read_settings(path))


def config_text(config: RunConfig) -> str:
    """Every field of `config` as YAML, in the dataclass's order: read_config loads it back equal."""
    return yaml.safe_dump(config.to_dict(), sort_keys=False, allow_unicode=True)
