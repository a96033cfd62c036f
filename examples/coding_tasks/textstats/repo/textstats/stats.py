"""Counting words."""


def words(text: str) -> list[str]:
    """The words of `text`."""
    return text.split(" ")


def word_count(text: str) -> int:
    """How many words `text` has."""
    return len(words(text))


def average_word_length(text: str) -> float:
    """The mean length of the words of `text` (0.0 for a text without words)."""
    found = words(text)
    return sum(map(len, found)) / len(found) if found else 0.0


def longest_word(text: str) -> str:
    """The longest word of `text` (the first of several as long; "" for a text without words)."""
    return max(words(text), key=len, default="")
