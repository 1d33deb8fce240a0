"""Stand-in for the expecttest package, which Debian does not ship: enough for
torch.testing._internal.common_utils to import, so that the macOS suite
(fork-overlay/test/test_mps_parallel.py) runs here on its real TestCase."""

import unittest

ACCEPT = False


class TestCase(unittest.TestCase):
    pass
