"""How a number is obtained: the stopwatch protocol (warm-up, timed window, stop rule, percentiles,
multi-instance common window), the noise signals that flag a disturbed measurement, and drift
against the FP32 reference. Pure functions over timestamps and arrays, tested on synthetic series.

May import common only.
"""
