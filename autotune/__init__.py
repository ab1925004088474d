"""autotune: search for the fastest way to run a PyTorch model on this CPU server, and prove it.

Kept import-free on purpose: the worker runs in every runtime and must start fast.
"""

__version__ = "0.1.0"
