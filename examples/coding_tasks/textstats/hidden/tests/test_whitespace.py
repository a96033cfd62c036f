import unittest

from textstats import average_word_length, longest_word, word_count


class WhitespaceTest(unittest.TestCase):
    def test_runs_of_spaces_tabs_and_newlines_separate_words(self):
        self.assertEqual(word_count("the  quick\tbrown\nfox "), 4)
        self.assertEqual(word_count("  leading and trailing  "), 3)

    def test_a_text_without_words(self):
        self.assertEqual(word_count(""), 0)
        self.assertEqual(word_count(" \n\t "), 0)
        self.assertEqual(average_word_length("   "), 0.0)
        self.assertEqual(longest_word(""), "")

    def test_average_ignores_extra_spaces(self):
        self.assertEqual(average_word_length("ab   abcd"), 3.0)

    def test_single_spaces_still_work(self):
        self.assertEqual(word_count("the quick brown fox"), 4)


if __name__ == "__main__":
    unittest.main()
