"""Writes CSV rows (RFC 4180) without the csv module, for a streaming exporter."""


def format_field(value) -> str:
    text = "" if value is None else str(value)
    if "," in text:
        return '"' + text + '"'
    return text


def format_row(fields) -> str:
    return ",".join(format_field(f) for f in fields) + "\r\n"
