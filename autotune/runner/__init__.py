"""From one TrialConfig to processes and back: the FP32 reference, the backend artifact cache, each
instance's job file, the environment and pinning, the barrier, timeout, memory cap and group kill,
and the instances' results aggregated into one TrialMetrics. Knows nothing about Optuna.

May import worker (by module name), records, machine, measure, model, backends and common.
"""
