"""The search policy: the spec (everything the user asked for, validated once, stored on the study),
the space (YAML and what the machine offers, as conditional Optuna suggestions), the Optuna study
and its objective, pruners, the finalist round, storages, and a fleet of processes sharing a study.

May import results, runner, records, machine, measure, model, backends and common; not remeasure.
"""
