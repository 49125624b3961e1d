"""pydantic's validation errors as `field.path: problem` lines that a person can act on."""

from __future__ import annotations

from pydantic import ValidationError


def problems(e: ValidationError, unknown_key: str = "unknown key (a typo?)") -> list[tuple[str, str]]:
    """(dotted field path, message) per error, without pydantic's type tags and links."""
    out = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"])
        msg = unknown_key if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
        out.append((loc, msg))
    return out
