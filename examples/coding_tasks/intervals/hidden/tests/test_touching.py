import unittest

from intervals import merge, total_length


class TouchingIntervalsTest(unittest.TestCase):
    def test_touching_intervals_merge(self):
        self.assertEqual(merge([(1, 3), (3, 5)]), [(1, 5)])
        self.assertEqual(merge([(3, 5), (1, 3), (5, 5)]), [(1, 5)])

    def test_points(self):
        self.assertEqual(merge([(2, 2), (2, 2)]), [(2, 2)])

    def test_total_length_of_touching_intervals(self):
        self.assertEqual(total_length([(0, 1), (1, 2), (2, 3)]), 3)

    def test_gaps_stay(self):
        self.assertEqual(merge([(1, 2), (3, 4)]), [(1, 2), (3, 4)])


if __name__ == "__main__":
    unittest.main()
