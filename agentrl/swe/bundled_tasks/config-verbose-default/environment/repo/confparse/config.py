"""A tiny `key = value` config format with typed getters and documented defaults.

Defaults (README): retries = 3, timeout = 30 (seconds), verbose = off.
"""

DEFAULTS = {"retries": "3", "timeout": "30", "verbose": "yes"}

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class Config:
    def __init__(self, values: dict[str, str]):
        self.values = {**DEFAULTS, **values}

    @classmethod
    def parse(cls, text: str) -> "Config":
        values = {}
        for n, line in enumerate(text.splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            key, eq, value = line.partition("=")
            if not eq:
                raise ValueError(f"line {n}: expected key = value")
            values[key.strip()] = value.strip()
        return cls(values)

    def get_int(self, key: str) -> int:
        return int(self.values[key])

    def get_bool(self, key: str) -> bool:
        value = self.values[key].lower()
        if value in _TRUE:
            return True
        if value in _FALSE:
            return False
        raise ValueError(f"{key}: {value!r} is not a boolean")
