import unittest

from roman import to_roman

# Numerals that need subtractive pairs (IV, IX, XL, XC, CD, CM), and additive ones that must still work.
EXPECTED = {
    4: "IV", 9: "IX", 14: "XIV", 40: "XL", 90: "XC", 400: "CD", 900: "CM",
    1994: "MCMXCIV", 2024: "MMXXIV", 3999: "MMMCMXCIX", 2023: "MMXXIII", 8: "VIII",
}


class SubtractiveNotationTest(unittest.TestCase):
    def test_numerals(self):
        for number, numeral in EXPECTED.items():
            with self.subTest(number=number):
                self.assertEqual(to_roman(number), numeral)


if __name__ == "__main__":
    unittest.main()
