"""python -m autotune.backends.generation: which generation precisions run in this runtime, as JSON."""

from autotune.backends.generation import main

if __name__ == "__main__":
    raise SystemExit(main())
