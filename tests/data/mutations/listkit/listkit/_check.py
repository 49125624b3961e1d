"""Argument checks shared by every helper."""


def positive(value, name):
    """`value` when it is an int of at least 1; TypeError or ValueError otherwise."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    return value
