"""The search policy: the space (YAML and what the machine offers, as conditional Optuna suggestions),
the Optuna study and its objective (which orders a trial's steps and hands its checks to drift_check,
speed_screening, slos and recording), the coverage order, layout rounds, priors, pruners, the finalist
round, storages, and a fleet of processes sharing a study. The spec it runs with is records/spec.py.

May import results, runner, records, machine, measure, model, backends and common; not remeasure.
"""
