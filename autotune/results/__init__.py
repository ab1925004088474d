"""What the user reads, from the stored study alone (never re-running the search): which trial won,
best.json, the leaderboard and failures by cause, the HTML report, the launch script, the live
progress panel, optuna-dashboard and the Optuna artifacts it shows.

May import runner, records, machine, measure, model, backends (the registry: a backend's rank when
configurations tie) and common; never tuning or remeasure.
"""
