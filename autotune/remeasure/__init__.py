"""Re-measurements outside a search: `verify` (the exported winner here, regressed or not), `bench`
(every backend x precision side by side), `compare` and its independent stopwatch (benchmark_app or
a plain timing loop).

May import results, runner, records, machine, measure, model, backends and common; not tuning.
"""
