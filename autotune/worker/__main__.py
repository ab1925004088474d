"""`python -m autotune.worker JOB.json | --best best.json --instance N`."""

import traceback

from autotune.worker.process import main
from autotune.worker.teardown import exit_code, exit_now

try:
    status = main()
except SystemExit as stop:  # the barrier's abort, a usage error
    status = exit_code(stop)
except KeyboardInterrupt:
    status = 130
except BaseException:  # any failure still ends without the destructors that can hang
    traceback.print_exc()
    status = 1
exit_now(status)
