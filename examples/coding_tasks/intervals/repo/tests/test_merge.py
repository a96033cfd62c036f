import unittest

from intervals import merge, total_length


class MergeTest(unittest.TestCase):
    def test_disjoint_intervals_are_sorted(self):
        self.assertEqual(merge([(5, 8), (1, 4)]), [(1, 4), (5, 8)])

    def test_overlapping_intervals_become_one(self):
        self.assertEqual(merge([(1, 5), (2, 3), (4, 9)]), [(1, 9)])

    def test_empty(self):
        self.assertEqual(merge([]), [])

    def test_total_length(self):
        self.assertEqual(total_length([(0, 2), (1, 3), (10, 11)]), 4)


if __name__ == "__main__":
    unittest.main()
