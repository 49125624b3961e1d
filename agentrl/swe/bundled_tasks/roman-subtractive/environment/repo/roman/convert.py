"""Roman numerals for 1..3999."""

_TABLE = [
    (1000, "M"), (900, "CM"), (500, "D"), (400, "CD"),
    (100, "C"), (90, "XC"), (50, "L"), (40, "XL"),
    (10, "X"), (5, "V"), (1, "I"),
]


def to_roman(n: int) -> str:
    if not 0 < n < 4000:
        raise ValueError(f"{n} is outside 1..3999")
    out = []
    for value, symbol in _TABLE:
        count, n = divmod(n, value)
        out.append(symbol * count)
    return "".join(out)
