"""Offline assets for the demo, the tests and the benches (not imported by the server or clients at run time)."""
