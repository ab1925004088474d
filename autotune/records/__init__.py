"""The typed records that cross layer boundaries: a trial's configuration (TrialConfig, with the
environment and pinning it implies) and what a trial measured (TrialMetrics and its parts), each
with one to_json / from_json so that a misspelt field is an error, not a silent None.

May import machine, measure, model, backends and common.
"""
