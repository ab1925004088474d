"""Helpers every layer may use: the two error types, atomic file writes, durations and sizes,
storage URLs (password masked, driver filled in), and the CPU's flags.

May import nothing else from autotune.
"""
