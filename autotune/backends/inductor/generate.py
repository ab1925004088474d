"""torch.compile (inductor) of the decoder's forward: the eager generator's model, quantized the same way
(the same artifact), with the inductor flags the configuration asks for."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.backends.base import BackendSpec, choice
from autotune.backends.eager import generate as eager
from autotune.backends.generation.quantization import MIX_KEPT, TorchGenerateOptions

if TYPE_CHECKING:
    from autotune.backends.base import BackendConfig
    from autotune.backends.generation.decode_loop import Generator


@dataclass(frozen=True)
class InductorGenerateOptions(TorchGenerateOptions):
    """eager's options and inductor's flags."""

    max_autotune: bool = choice(False, True)
    cpp_wrapper: bool = choice(False, True)
    concat_linear: bool = choice(False, True)
    freezing: bool = choice(False, True)


SPEC = BackendSpec(
    name="inductor",
    description="torch.compile (inductor) of the decoder's forward, torchao quantization",
    precisions=eager.SPEC.precisions,
    task="generate",
    options=InductorGenerateOptions,
    requires=eager.SPEC.requires,
    packages=eager.SPEC.packages,
    complexity=1,
    prepare_cost=5,  # torch.compile's code generation
    uses_artifact=eager.SPEC.uses_artifact,
    torch_threads=True,
    inductor_cache=True,
    kept_types=tuple(MIX_KEPT.items()),
)

# eager's artifact (the same quantized weights), and eager's answers to what cannot run (nothing: a flag
# this torch lacks is reported in the details; a precision this torchao lacks is left out before)
ARTIFACT_VERSION = eager.ARTIFACT_VERSION
artifact_identity = eager.artifact_identity
build_artifact = eager.build_artifact
cached_artifact = eager.cached_artifact
unsupported = eager.unsupported
unavailable = eager.unavailable


def prepare(
    model: Any, config: BackendConfig, new_tokens: int, calibration: Any = None, artifact: dict[str, Any] | None = None
) -> tuple[Generator, dict[str, Any]]:
    """The eager generator with its forward compiled under the configuration's inductor flags."""
    import torch

    generator, details = eager.prepare(model, config, new_tokens, calibration, artifact)
    options = InductorGenerateOptions.of(config)
    details["inductor"] = inductor_settings(options)
    mode = "max-autotune-no-cudagraphs" if options.max_autotune else None
    generator.forward = torch.compile(generator.model.forward, mode=mode, dynamic=None)
    generator.compiled = True
    return generator, details


def inductor_settings(options: InductorGenerateOptions) -> dict[str, Any]:
    """Set the inductor flags this config asks for; returns what was set (flags this torch lacks are
    reported, not silently dropped)."""
    import torch._inductor.config as inductor_config

    wanted = {
        "max_autotune": ("max_autotune", bool(options.max_autotune)),
        "cpp_wrapper": ("cpp_wrapper", bool(options.cpp_wrapper)),
        "freezing": ("freezing", bool(options.freezing)),
        "concat_linear": ("cpp.enable_concat_linear", bool(options.concat_linear)),
    }
    applied: dict[str, Any] = {}
    for name, (path, value) in wanted.items():
        target: Any = inductor_config
        *parents, leaf = path.split(".")
        for parent in parents:
            target = getattr(target, parent)
        if not hasattr(target, leaf):
            applied[name] = "not in this torch"
            continue
        setattr(target, leaf, value)
        applied[name] = value
    if options.max_autotune and hasattr(inductor_config.cpp, "use_small_dequant_buffer"):
        inductor_config.cpp.use_small_dequant_buffer = True  # what the int4 recipe pairs with max-autotune
        applied["use_small_dequant_buffer"] = True
    return applied
