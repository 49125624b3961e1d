"""Strict parsing of ISO (YYYY-MM-DD) and European (DD/MM/YYYY) dates."""

import datetime
import re

_DAYS = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]


def is_leap(year: int) -> bool:
    return year % 4 == 0 and year % 100 != 0


def days_in_month(year: int, month: int) -> int:
    return 29 if month == 2 and is_leap(year) else _DAYS[month - 1]


def parse_date(text: str) -> datetime.date:
    text = text.strip()
    if m := re.fullmatch(r"(\d{4})-(\d{2})-(\d{2})", text):
        year, month, day = (int(g) for g in m.groups())
    elif m := re.fullmatch(r"(\d{2})/(\d{2})/(\d{4})", text):
        day, month, year = (int(g) for g in m.groups())
    else:
        raise ValueError(f"not a date: {text!r}")
    if not 1 <= month <= 12 or not 1 <= day <= days_in_month(year, month):
        raise ValueError(f"no such day: {text!r}")
    return datetime.date(year, month, day)
