"""Helpers every layer may use: the two error types, atomic file writes, durations and sizes, and
storage URLs (password masked, driver filled in).

May import nothing else from autotune.
"""
