"""autotune: search for the fastest way to run a PyTorch model on this CPU server, and prove it.

Kept import-free on purpose: the worker runs in every runtime and must start fast.
"""

__version__ = "0.1.0"


def load(best_path=None, model=None, check_environment=True):
    """The tuned inference callable from best.json (see autotune.api.load); imported on use."""
    from autotune.api import load as _load

    return _load(best_path, model, check_environment)
