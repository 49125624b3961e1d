"""Fitting text into a width."""

from ._check import positive


def truncate(text, width, suffix="..."):
    """`text` cut to at most `width` characters, ending in `suffix` when it was cut."""
    positive(width, "width")
    if len(text) <= width:
        return text
    if width <= len(suffix):
        return suffix[:width]
    return text[:width - len(suffix)] + suffix


def wrap_words(text, width):
    """The words of `text` in lines of at most `width` characters (a longer word gets its own line)."""
    positive(width, "width")
    lines, line = [], ""
    for word in text.split():
        if not line:
            line = word
        elif len(line) + 1 + len(word) <= width:
            line = line + " " + word
        else:
            lines.append(line)
            line = word
    if line:
        lines.append(line)
    return lines
