"""Fuzzing the parsers: seed inputs, the one-input runner, and the atheris harness (see README.md)."""
