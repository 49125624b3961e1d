"""Config files read, and pydantic's validation errors as `field.path: problem` lines that a person can act on."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


def problems(e: ValidationError, unknown_key: str = "unknown key (a typo?)") -> list[tuple[str, str]]:
    """(dotted field path, message) per error, without pydantic's type tags and links."""
    out = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"])
        msg = unknown_key if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
        out.append((loc, msg))
    return out


def validate_section(model: type[M], data: Any, source: str, error: type[Exception]) -> M:
    """A config section as `model`; `error` lists every problem as `source.field: problem`."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise error("\n".join(f"{source}.{field}: {msg}" if field else f"{source}: {msg}"
                               for field, msg in problems(e))) from None


class ConfigFileError(ValueError):
    """A config file that cannot be read as YAML; the message names it."""


def read_yaml_file(path: Path | str) -> Any:
    """The one reader of a config file: its YAML, or ConfigFileError naming the file and why."""
    import yaml

    try:
        return yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigFileError(f"{path}: no such config file") from None
    except (OSError, yaml.YAMLError) as e:
        raise ConfigFileError(f"{path}: cannot be read as YAML ({e})") from None
