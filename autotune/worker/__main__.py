"""`python -m autotune.worker JOB.json | --best best.json --instance N`."""

import sys

from autotune.worker.process import main

sys.exit(main())
