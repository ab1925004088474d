"""Runs inside a runtime (a Python environment) and prints what it can do, as JSON.

    python -m autotune.machine.runtime_report

Which backends import for real (not only whether their packages exist: a torch/IPEX version mismatch
fails at import), the versions of the packages that matter, and the OpenMP libraries this runtime's
torch can run with. Standard library only (and autotune's stdlib-only modules): it must start in any runtime.
"""

from __future__ import annotations

import contextlib
import glob
import importlib
import io
import json
import os
import platform
import sys
import warnings

from autotune.machine.fingerprint import package_versions

# The packages whose versions decide what an artifact holds: the artifact cache keys on them.
ARTIFACT_PACKAGES = (
    "torch",
    "torchvision",
    "onnx",
    "onnxscript",
    "onnxruntime",
    "openvino",
    "nncf",
    "torchao",
    "intel-extension-for-pytorch",
)
# transformers: the layers of a language model tuned for generation
PACKAGES = (*ARTIFACT_PACKAGES, "numpy", "intel-openmp", "transformers", "llama_cpp_python")


def _try_import(modules: tuple[str, ...]) -> str | None:
    """None when every module imports, else the first failure as one line."""
    for module in modules:
        try:
            with (
                warnings.catch_warnings(),
                contextlib.redirect_stdout(io.StringIO()),
                contextlib.redirect_stderr(io.StringIO()),
            ):
                warnings.simplefilter("ignore")
                importlib.import_module(module)
        except BaseException as exc:  # an extension built for another torch can raise anything, even SystemExit
            lines = str(exc).strip().splitlines() or [""]
            return f"{module}: {type(exc).__name__}: {lines[0][:200]}"
    return None


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


def report(backend_requires: dict[str, tuple[str, ...]]) -> dict[str, object]:
    torch_error = _try_import(("torch",))
    backends = {name: _try_import(requires) for name, requires in backend_requires.items()}
    versions = package_versions(PACKAGES)
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
    from autotune.backends import BACKENDS

    print(json.dumps(report({name: spec.requires for name, spec in BACKENDS.items()})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
