import unittest

from roman import to_roman


class SubtractiveNotationTest(unittest.TestCase):
    def test_four_and_nine(self):
        self.assertEqual(to_roman(4), "IV")
        self.assertEqual(to_roman(9), "IX")
        self.assertEqual(to_roman(14), "XIV")

    def test_forty_ninety_and_beyond(self):
        self.assertEqual(to_roman(40), "XL")
        self.assertEqual(to_roman(90), "XC")
        self.assertEqual(to_roman(400), "CD")
        self.assertEqual(to_roman(900), "CM")

    def test_years(self):
        self.assertEqual(to_roman(1994), "MCMXCIV")
        self.assertEqual(to_roman(2024), "MMXXIV")
        self.assertEqual(to_roman(3999), "MMMCMXCIX")

    def test_additive_numbers_still_work(self):
        self.assertEqual(to_roman(2023), "MMXXIII")
        self.assertEqual(to_roman(8), "VIII")


if __name__ == "__main__":
    unittest.main()
