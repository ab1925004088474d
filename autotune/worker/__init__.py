"""The trial process: one instance of one trial, job JSON in, result JSON out (`python -m autotune.worker`).

It runs inside whichever runtime the trial was routed to, knows nothing about the search or Optuna,
and keeps its imports light.
May import records, model, measure, backends and common; never the
runner, tuning, results or remeasure above it. best.json files name `python -m autotune.worker --best
best.json --instance N`, so that command keeps working.
"""
