import unittest

from roman import to_roman


class ToRomanTest(unittest.TestCase):
    def test_small_numbers(self):
        self.assertEqual(to_roman(1), "I")
        self.assertEqual(to_roman(3), "III")
        self.assertEqual(to_roman(8), "VIII")

    def test_a_year(self):
        self.assertEqual(to_roman(2023), "MMXXIII")

    def test_out_of_range(self):
        with self.assertRaises(ValueError):
            to_roman(0)


if __name__ == "__main__":
    unittest.main()
