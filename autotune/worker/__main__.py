"""`python -m autotune.worker JOB.json | --best best.json --instance N`."""

from autotune.worker.process import main
from autotune.worker.teardown import exit_code, exit_now

try:
    status = main()
except SystemExit as stop:  # the barrier's abort, a usage error
    status = exit_code(stop)
exit_now(status)
