"""autotune: search for the fastest way to run a PyTorch model on this CPU server, and prove it.

    import autotune
    result = autotune.search(model="my_models.py:build", input_shape="3x224x224", budget="20m")
    infer = autotune.load("studies/build/best.json")     # in a process started with the launch script

Kept import-free on purpose: the worker runs in every runtime and must start fast. `search`, `Result`,
`BestJson` and `UserError` are imported on first use (PEP 562). `autotune.search` is the function even
after the subpackage of the same name (autotune/search/) is imported; import its modules by their full
names: `from autotune.search.study import run_search`.
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


def _keep_api_names():
    """Importing a subpackage sets it as an attribute of its parent: the subpackage autotune.search would
    replace the function autotune.search. This package's module refuses that (the subpackage stays in
    sys.modules, where imports find it). `sys` is built in and already loaded: this costs no import time."""
    import sys

    module_type = type(sys)

    class Package(module_type):  # type: ignore[valid-type,misc]
        def __setattr__(self, name, value):
            if name in _LAZY and isinstance(value, module_type):
                return
            super().__setattr__(name, value)

    sys.modules[__name__].__class__ = Package


_keep_api_names()
