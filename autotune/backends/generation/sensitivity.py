"""Which of a language model's matrices a low weight type hurts most, measured once per model, text and type,
so a mix compresses the least sensitive ones first and keeps the rest in a higher type (`compressed_share`).

The method: each matrix alone is rounded to the engine's own low type (its bits, block and symmetry), the
model runs in FP32 over the calibration windows (of the same text as the drift prompts, drawn with a seed of
their own: they may overlap them, so the drift of a mix is not measured on held-out text), and the mean KL
divergence of its next-token distributions from the unrounded model's, over the last positions of each window, is that
matrix's sensitivity: the measure the quality bound judges, one forward per matrix. A layer-local estimate
(the input-weighted rounding error behind llama.cpp's importance matrix and NNCF's hessian_input_activation,
one forward in all) was tried first and ranked worse than chance on a trained Llama: it cannot see that
an error in the first block travels through every later one while a query projection's is damped by the
softmax. Whether the ranking means something is tested, not assumed: the least sensitive layers, compressed,
drift less than as many random ones, measured by the engine (tests/test_mixed_precision.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from autotune.common.json_record import Record

METHOD_ID = "kld-one-at-a-time-2"  # in a mixed artifact's key: another method ranks another mix (2: Conv1D ranked)
METHOD = "each matrix alone in the low type (fake-quantized), FP32 forward: mean KL divergence from FP32"
IMATRIX_ID = "input-energy-1"  # in an artifact's key: llama.cpp's importance matrix as input_energy computes it
IMATRIX_METHOD = "E[x^2] per input column of every Linear, one FP32 forward over the calibration text"
SCORED_POSITIONS = 64  # the last positions of each calibration window whose next-token distributions count
# compressed_share's values in every engine's options, the whole-model file (1) first: the mix search bisects them
SHARES = (1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125, 0.0)


def share_refusal(share: float, precision: str, mixable: Any) -> str | None:
    """Why a config's compressed_share cannot run (None: it can): a mix needs one of the engine's `mixable`
    low types (a share of a 16-bit or unquantized type would rank the model and then change nothing)."""
    if share != 1.0 and precision not in mixable:
        return f"compressed_share means a mix of a quantized type with a wider one; {precision} is not one"
    if not 0.0 <= share <= 1.0:
        return f"compressed_share must lie in [0, 1], got {share}"
    return None


@dataclass(frozen=True)
class WeightFormat:
    """A low weight type as the rounding it does: bits, values per scale (None: one per output row), and
    whether the grid is symmetric about zero (else a minimum per block, as K-quants and asym types keep)."""

    bits: int
    block: int | None
    symmetric: bool


# The engines' low types as their rounding (llama.cpp's ggml-quants.c block layouts; NNCF's defaults: int8
# per output channel, int4 in groups of 128). A K-quant's super-block scales are finer than modelled here.
FORMATS: dict[str, WeightFormat] = {
    "Q8_0": WeightFormat(8, 32, True),
    "Q6_K": WeightFormat(6, 16, True),
    "Q5_K_M": WeightFormat(5, 32, False),
    "Q4_K_M": WeightFormat(4, 32, False),
    "Q4_0": WeightFormat(4, 32, True),
    "Q2_K": WeightFormat(2, 16, False),
    "int8_sym": WeightFormat(8, None, True),
    "int8_asym": WeightFormat(8, None, False),
    "int4_sym": WeightFormat(4, 128, True),
    "int4_asym": WeightFormat(4, 128, False),
}


@dataclass(frozen=True)
class LayerSensitivity(Record):
    """One matrix: its module name, parameters, and the output error its low type puts on it."""

    name: str
    parameters: int
    score: float


@dataclass(frozen=True)
class Sensitivity(Record):
    """A model's matrices ranked for one low type, least sensitive first (the order a mix compresses them)."""

    NESTED: ClassVar[dict[str, type[Record]]] = {"layers": LayerSensitivity}
    TUPLES: ClassVar[tuple[str, ...]] = ("layers",)

    low_type: str
    method: str
    layers: tuple[LayerSensitivity, ...]
    calibration_tokens: int = 0
    measured_s: float = 0.0  # how long measuring it took (a cached ranking is read in no time: this is its cost)

    def compressed(self, share: float) -> tuple[str, ...]:
        """The least sensitive layers holding `share` of the ranked parameters (the first past it included,
        as NNCF's ratio counts): 0 compresses none, 1 all."""
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"compressed_share must lie in [0, 1], got {share}")
        total = sum(layer.parameters for layer in self.layers)
        chosen: list[str] = []
        done = 0
        for layer in self.layers:
            if done >= share * total - 1e-9 * total:
                break
            chosen.append(layer.name)
            done += layer.parameters
        return tuple(chosen)

    def kept(self, share: float) -> tuple[str, ...]:
        """The layers a share leaves in the higher type, most sensitive first."""
        compressed = set(self.compressed(share))
        return tuple(layer.name for layer in reversed(self.layers) if layer.name not in compressed)

    def mix_details(self, share: float, kept_type: str) -> dict[str, Any]:
        """What a mixed artifact's build reports (its trial's details, best.json's `mix`, the mix's check)."""
        kept = self.kept(share)
        return {
            "compressed_share": share,
            "kept_type": kept_type,
            "kept_layers": list(kept),
            "compressed_layers": len(self.layers) - len(kept),
            "sensitivity": self.to_json(),
        }


def fake_quantize(weight: Any, fmt: WeightFormat) -> Any:
    """The weight as the low type stores it, dequantized: round to `bits` per block of input columns (or per
    output row), symmetric (scale from the largest magnitude) or with a minimum (scale from the range)."""
    import torch

    rows, cols = weight.shape
    block = cols if fmt.block is None or cols % fmt.block else fmt.block
    w = weight.detach().to(torch.float32).reshape(rows, cols // block, block)
    levels = 2**fmt.bits - 1
    if fmt.symmetric:
        scale = w.abs().amax(dim=-1, keepdim=True) / (levels // 2)
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        q = torch.clamp(torch.round(w / scale), -(levels // 2) - 1, levels // 2) * scale
    else:
        low, high = w.amin(dim=-1, keepdim=True), w.amax(dim=-1, keepdim=True)
        scale = (high - low) / levels
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        q = torch.clamp(torch.round((w - low) / scale), 0, levels) * scale + low
    return q.reshape(rows, cols)


def is_conv1d(module: Any) -> bool:
    """transformers' Conv1D (GPT-2's projections): a Linear whose weight is stored transposed (in x out)."""
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf")


def projections(model: Any) -> dict[str, Any]:
    """Every matrix product with a weight, by module name: nn.Linear and transformers' Conv1D."""
    import torch

    return {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) or is_conv1d(m)}


def ranked_linears(model: Any) -> dict[str, Any]:
    """The model's projections a mix ranks, by name: every one but the output layer (the engines give the
    output and the embedding their own type)."""
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return {name: module for name, module in projections(model).items() if module is not output}


def decoder_blocks(model: Any) -> tuple[str, list[Any]]:
    """The model's repeated blocks in call order and their list's module name: its longest ModuleList (a
    decoder's layers). ("", []) where it has none."""
    import torch

    lists = [(name, m) for name, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m)]
    if not lists:
        return "", []
    name, blocks = max(lists, key=lambda pair: len(pair[1]))
    return name, list(blocks)


def block_of(name: str, blocks_name: str, count: int) -> int:
    """Which block a module name lies in (0: outside the blocks, so the whole forward runs)."""
    prefix = f"{blocks_name}." if blocks_name else ""
    head = name[len(prefix) :].split(".", 1)[0] if prefix and name.startswith(prefix) else ""
    return int(head) if head.isdigit() and int(head) < count else 0


def rank_layers(model: Any, calibration: Any, low_type: str, fmt: WeightFormat | None = None) -> Sensitivity:
    """Every ranked Linear's sensitivity to `low_type` (a key of FORMATS, or any name with its `fmt`), least
    sensitive first: the KL divergence the model's next-token distributions move by when that matrix alone
    is rounded to it.

    A matrix in block i changes nothing before block i, so the blocks before it return the outputs they
    gave the unrounded model (kept from its forward) instead of computing them again: on a decoder the
    forwards cost about half, and the scores are the full forward's (tests/test_mixed_precision.py)."""
    import inspect

    import torch

    fmt = fmt or FORMATS[low_type]
    ids = torch.as_tensor(calibration)
    scored = min(SCORED_POSITIONS, ids.shape[1])
    accepted = inspect.signature(model.forward).parameters
    # no KV cache (the skipped blocks would leave it holes); only the scored positions' logits
    call = {key: value for key, value in (("use_cache", False), ("logits_to_keep", scored)) if key in accepted}
    blocks_name, blocks = decoder_blocks(model)
    outputs: dict[int, Any] = {}

    def log_probs() -> Any:
        with torch.inference_mode():
            out = model(ids, **call).logits[:, -scored:]
        return torch.log_softmax(out.reshape(-1, out.shape[-1]).to(torch.float64), dim=-1)

    def mean_kl_divergence(candidate: Any, reference: Any) -> float:
        """Mean over positions of KL(P_fp32 || P_candidate) in nats (measure/drift.py's, on log-probabilities)."""
        return max(float((reference.exp() * (reference - candidate)).sum(dim=-1).mean()), 0.0)

    order: list[int] = []

    def keep(index: int) -> Any:
        def hook(module: Any, inputs: Any, output: Any) -> None:
            outputs[index] = output
            order.append(index)

        return hook

    def replay(index: int) -> Any:
        return lambda *args, **kwargs: outputs[index]

    started = time.monotonic()
    model.eval()
    handles = [block.register_forward_hook(keep(i)) for i, block in enumerate(blocks)]
    try:
        reference = log_probs()
    finally:
        for handle in handles:
            handle.remove()
    # replayed only where the forward called each block once, in order, and no block's forward is already an
    # instance attribute (a hook library's wrapper, which the replay would replace and then delete)
    replayable = order == list(range(len(blocks))) and not any("forward" in vars(block) for block in blocks)
    layers = []
    for name, module in ranked_linears(model).items():
        start = block_of(name, blocks_name, len(blocks)) if replayable else 0
        weight = module.weight.data
        if is_conv1d(module):  # rounded along its input, as the engines store it: out x in
            module.weight.data = fake_quantize(weight.t(), fmt).t().contiguous().to(weight.dtype)
        else:
            module.weight.data = fake_quantize(weight, fmt).to(weight.dtype)
        for index in range(start):
            blocks[index].forward = replay(index)  # an instance attribute: Module.__call__ calls it
        try:
            score = mean_kl_divergence(log_probs(), reference)
        finally:
            module.weight.data = weight
            for index in range(start):
                del blocks[index].forward
        layers.append(LayerSensitivity(name, int(weight.numel()), score))
    layers.sort(key=lambda layer: (layer.score, layer.name))
    return Sensitivity(low_type, METHOD, tuple(layers), int(ids.numel()), round(time.monotonic() - started, 3))


def weights_digest(model: Any) -> str:
    """sha256 of every parameter and buffer, by name: the ranking belongs to these weights."""
    import torch

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def cached_ranking(
    model: Any, calibration: Any, low_type: str, artifact_dir: Path, fmt: WeightFormat | None = None
) -> Sensitivity:
    """The ranking for these weights, calibration ids and type, measured once and kept beside the artifacts
    (`<cache>/sensitivity/`, beside `<cache>/artifacts/`): every share of a mix reads the same one. An
    artifact built outside the cache (a scratch folder, where the cached one was evicted) ranks uncached."""
    import torch

    ids = torch.as_tensor(calibration).to(torch.int64)
    fmt = fmt or FORMATS[low_type]
    artifacts = Path(artifact_dir).resolve().parent
    if artifacts.name != "artifacts":
        return rank_layers(model, ids, low_type, fmt)
    key = hashlib.sha256(
        f"{METHOD_ID}:{low_type}:{fmt}:{weights_digest(model)}:{tuple(ids.shape)}:".encode() + ids.numpy().tobytes()
    ).hexdigest()[:24]
    folder = artifacts.parent / "sensitivity"
    path = folder / f"{low_type}-{key}.json"
    try:
        return Sensitivity.from_json(json.loads(path.read_text()))
    except (OSError, ValueError):
        pass
    ranking = rank_layers(model, ids, low_type, fmt)
    folder.mkdir(parents=True, exist_ok=True)
    scratch = path.with_suffix(f".{os.getpid()}.tmp")
    scratch.write_text(json.dumps(ranking.to_json()))
    scratch.replace(path)  # whole or absent, when two trials rank at once
    return ranking


def module_name(model: Any, module: Any) -> str | None:
    """The name `module` has in `model` (None: not one of its modules)."""
    return next((name for name, m in model.named_modules() if m is module), None)


def edge_layers(model: Any) -> tuple[str, ...]:
    """The output layer's and the token embedding's module names: what a mix keeps wide beside its kept
    matrices (llama.cpp's own quantizer keeps both widest)."""
    edges = []
    for getter in ("get_output_embeddings", "get_input_embeddings"):
        module = getattr(model, getter)() if hasattr(model, getter) else None
        name = module_name(model, module) if module is not None else None
        if name:
            edges.append(name)
    return tuple(edges)


def input_energy(model: Any, calibration: Any) -> dict[str, Any]:
    """The mean square of each input column of every Linear (the output layer included) over the calibration
    ids, one FP32 forward: llama.cpp's importance matrix (what `llama-imatrix` computes, E[x_j^2]), which its
    quantizer uses to weigh each column's rounding error."""
    import torch

    linears = projections(model)
    sums: dict[str, Any] = {}
    counts: dict[str, int] = {}

    def hook(name: str) -> Any:
        def collect(module: Any, inputs: tuple[Any, ...], output: Any) -> None:
            x = inputs[0].detach().to(torch.float64).reshape(-1, inputs[0].shape[-1])
            sums[name] = sums.get(name, 0) + (x * x).sum(dim=0)
            counts[name] = counts.get(name, 0) + x.shape[0]

        return collect

    handles = [module.register_forward_hook(hook(name)) for name, module in linears.items()]
    try:
        with torch.inference_mode():
            model.eval()(torch.as_tensor(calibration))
    finally:
        for handle in handles:
            handle.remove()
    return {name: (sums[name] / counts[name]).to(torch.float32).numpy() for name in sums}
