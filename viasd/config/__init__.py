"""`params.yaml`: loaded once, merged with optional override files, validated against
`viasd/schemas/params.schema.yaml` (shipped with the package) and the cross-key checks (`checks.py`), and
parsed into typed, frozen objects (`sections.py`).

Every problem is a `ConfigError` naming the file and the key, e.g.
`params.yaml: models.families.default.target.layers: 'twelve' is not of type 'integer'`.
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from ..errors import ConfigError
from .checks import KNOWN_TASKS, check_semantics
from .sections import (
    DEFAULT_MAX_NEW_TOKENS,
    BatchTableParams,
    DataParams,
    DecodeParams,
    DimrParams,
    Family,
    FeatureDrafterArch,
    ModelArch,
    Pair,
    Params,
    RouterParams,
    SelfDrafterParams,
    StudyParams,
    ThresholdParams,
    TrainParams,
    parse,
)

__all__ = ["BatchTableParams", "ConfigError", "DEFAULT_MAX_NEW_TOKENS", "DataParams", "DecodeParams", "DimrParams", "Family",
           "FeatureDrafterArch", "KNOWN_TASKS", "ModelArch", "Pair", "Params", "RouterParams", "SCHEMA",
           "SelfDrafterParams", "StudyParams", "ThresholdParams", "TrainParams", "deep_merge", "load", "parse",
           "resolve", "validate"]

SCHEMA = Path(__file__).resolve().parent.parent / "schemas" / "params.schema.yaml"  # package data


def deep_merge(base: dict, override: dict) -> dict:
    """`base` with `override` merged over it, mappings key by key, anything else replaced (copies)."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _read_yaml(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"parameter file {path} does not exist") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {str(err).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of parameters at the top level")
    return data


def _schema() -> dict:
    return yaml.safe_load(SCHEMA.read_text())


def validate(raw: dict, source: str = "params.yaml") -> None:
    """Check `raw` against the schema, then the cross-key checks; the first problem is one `ConfigError`."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(_schema())
    errors = sorted(validator.iter_errors(raw), key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    if errors:
        err = jsonschema.exceptions.best_match(errors)
        where = ".".join(str(p) for p in err.absolute_path) or "(top level)"
        raise ConfigError(f"{source}: {where}: {err.message}")
    check_semantics(raw, source)


def resolve(path: str | Path = "params.yaml", overrides: list[str | Path] = ()) -> dict:
    """The validated parameters of `path` with each override file merged over it (a plain dict)."""
    path = Path(path)
    raw = _read_yaml(path)
    source = path.name
    for extra in overrides:
        raw = deep_merge(raw, _read_yaml(Path(extra)))
        source += f" + {Path(extra).name}"
    validate(raw, source)
    return raw


def load(path: str | Path = "params.yaml", overrides: list[str | Path] = ()) -> Params:
    """Read `path`, merge each override file over it, validate, parse. Paths in it are relative to
    the directory of `path`."""
    return parse(resolve(path, overrides), Path(path).parent)
