"""Runs inside a runtime (a Python environment) and prints what it can do, as JSON.

    python -m autotune.machine.runtime_report

Which backends import for real (each one's `unavailable()`: not only whether their packages exist, a
torch/IPEX version mismatch fails at import), the versions of the packages that matter, and the OpenMP
libraries this runtime's torch can run with. Standard library only (and autotune's stdlib-only modules,
the backend registry among them): it must start in any runtime.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import platform
import sys

from autotune.machine.fingerprint import package_versions

# Everyone's packages (transformers' and the backends' own are in their SPECs: packages): their versions
# are reported, and the artifact cache keys on them.
CORE_PACKAGES = ("torch", "torchvision", "numpy", "intel-openmp")


def reported_packages() -> tuple[str, ...]:
    """The packages whose versions a runtime reports: the core ones and every registered backend's."""
    from autotune.backends import backend_packages

    return tuple(dict.fromkeys((*CORE_PACKAGES, *backend_packages())))


def _openmp_libraries() -> dict[str, str]:
    """GNU OpenMP as bundled with torch; Intel OpenMP from the intel-openmp wheel in this environment."""
    found: dict[str, str] = {}
    with contextlib.suppress(Exception):
        import importlib.util

        spec = importlib.util.find_spec("torch")
        if spec and spec.origin:
            torch_dir = os.path.dirname(spec.origin)
            for pattern in ("lib/libgomp*.so*", "../torch.libs/libgomp*.so*"):
                matches = sorted(glob.glob(os.path.join(torch_dir, pattern)))
                if matches:
                    found["gnu"] = os.path.realpath(matches[0])
                    break
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix)):
        candidate = os.path.join(prefix, "lib", "libiomp5.so")
        if os.path.isfile(candidate):
            found["intel"] = candidate
            break
    return found


def report(backends: dict[str, str | None]) -> dict[str, object]:
    """`backends`: each backend's name and why it cannot run here (None: it can)."""
    from autotune.backends.base import first_import_failure

    torch_error = first_import_failure(("torch",))
    versions = package_versions(reported_packages())
    return {
        "python": sys.executable,
        "python_version": platform.python_version(),
        "prefix": sys.prefix,
        "torch": versions.get("torch") if torch_error is None else None,
        "torch_error": torch_error,
        "packages": versions,
        "backends": backends,  # name -> None (imports) or why not
        "openmp": _openmp_libraries(),
    }


def main() -> int:
    from autotune.backends import BACKENDS, backend_module

    print(json.dumps(report({name: backend_module(name).unavailable() for name in BACKENDS})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
