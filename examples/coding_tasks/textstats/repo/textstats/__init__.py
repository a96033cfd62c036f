"""Statistics of texts."""

from textstats.stats import average_word_length, longest_word, word_count

__all__ = ["average_word_length", "longest_word", "word_count"]
