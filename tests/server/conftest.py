"""The server tests share the suite-wide `server` and `stub` fixtures of tests/conftest.py."""
