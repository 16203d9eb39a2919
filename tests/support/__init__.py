"""Helpers that several test modules share, kept out of the test modules themselves."""
