"""URL slugs for titles."""

import re


def slugify(text: str, sep: str = "-") -> str:
    """Lowercase ASCII words of `text` joined by `sep`, e.g. "Hello World" -> "hello-world"."""
    text = text.strip().lower()
    return re.sub(r"[^a-z0-9]+", sep, text)
