"""Roman numerals."""

from roman.convert import to_roman

__all__ = ["to_roman"]
