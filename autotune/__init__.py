"""autotune: search for the fastest way to run a PyTorch model on this CPU server, and prove it.

    import autotune
    result = autotune.search(model="my_models.py:build", input_shape="3x224x224", budget="20m")
    infer = autotune.load("studies/build/best.json")     # in a process started with the launch script

Kept import-free on purpose: the worker runs in every runtime and must start fast. `search`, `Result`,
`BestJson`, `SearchOptions` and `UserError` are imported on first use (PEP 562). These names and the
command line are the public interface; the subpackages are the implementation.
"""

__version__ = "0.1.0"
__all__ = ["BestJson", "Result", "SearchOptions", "UserError", "load", "search"]

# name -> (module, attribute), imported on first access
_LAZY = {
    "search": ("autotune.api", "search"),
    "Result": ("autotune.api", "Result"),
    "BestJson": ("autotune.records.best", "BestJson"),
    "SearchOptions": ("autotune.records.options", "SearchOptions"),
    "UserError": ("autotune.common.errors", "UserError"),
}


def load(best_path=None, model=None, check_environment=True):
    """The tuned inference callable from best.json (see autotune.api.load); imported on use."""
    from autotune.api import load as _load

    return _load(best_path, model, check_environment)


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'autotune' has no attribute {name!r}")
    from importlib import import_module

    module_name, attribute = _LAZY[name]
    value = getattr(import_module(module_name), attribute)
    globals()[name] = value  # later accesses skip __getattr__
    return value


def __dir__():
    return sorted({*globals(), *_LAZY})
