"""Integers to Roman numerals."""

_NUMERALS = [(1000, "M"), (500, "D"), (100, "C"), (50, "L"), (10, "X"), (5, "V"), (1, "I")]


def to_roman(number: int) -> str:
    """The Roman numeral of `number`, 1 to 3999."""
    if not isinstance(number, int) or not 0 < number < 4000:
        raise ValueError(f"to_roman takes an integer from 1 to 3999, not {number!r}")
    letters = []
    for value, numeral in _NUMERALS:
        while number >= value:
            letters.append(numeral)
            number -= value
    return "".join(letters)
