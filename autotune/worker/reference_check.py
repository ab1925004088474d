"""A FP32 reference that carries no information, and what the reference process does about it.

When the outputs are the same for every evaluation input (torchvision's vision transformers zero their
head, so every random init answers zero), drift against them is 0 for any candidate, a broken int8
included. If the weights are autotune's own random init, the head's all-zero weights are redrawn
(seeded) before the init is saved, so every trial, on every backend, runs a model whose outputs are a
random projection of the last layer that varies; otherwise the search is refused, saying why.
"""

from __future__ import annotations

from typing import Any

from autotune.measure.drift import constant_across_samples
from autotune.model.head import CannotInspect, find_layers, redraw_zero_weights
from autotune.model.inputs import batch_len, synthetic, take
from autotune.model.seeds import EVAL_SEED
from autotune.model.sources import HUB_CACHE, MODEL_FILE, WEIGHTS_FILE, ModelSource
from autotune.records.reference import ReferenceNote

PROBE_SAMPLES = 4  # inputs run one by one to see which layers vary


def _what(outputs_all_zero: bool) -> str:
    return "all zero for every input" if outputs_all_zero else "constant across inputs"


def _weights(source: ModelSource) -> tuple[str, str]:
    """Where the weights come from, and what to do about a constant head in them."""
    if source.weights_origin == MODEL_FILE:
        return "the model file's weights", "save the model file with a trained head"
    if source.weights_origin == HUB_CACHE:
        return "the pretrained weights of the torch hub cache", "pass --weights with a trained head"
    if source.weights_origin == WEIGHTS_FILE:
        return "the --weights file", (
            "pass --weights with a trained head, or leave --weights out (a random init's all-zero head is redrawn)"
        )
    return "autotune's random init", "pass --weights with a trained head"


def examine(model: Any, inputs: tuple[Any, ...], source: ModelSource, all_zero: bool) -> ReferenceNote:
    """Find the last layer whose output varies; redraw the head after it when the weights are
    autotune's own random init (in place: the caller saves the init afterwards and recomputes)."""
    count = min(PROBE_SAMPLES, batch_len(inputs))
    probe = inputs if count >= 2 else synthetic(source.specs, PROBE_SAMPLES, EVAL_SEED)
    samples = [take(probe, slice(i, i + 1)) for i in range(min(PROBE_SAMPLES, batch_len(probe)))]
    what = f"the FP32 outputs are {_what(all_zero)}"
    blind = "so drift cannot tell a broken numerics from a correct one"
    try:
        layers = find_layers(model, samples, constant_across_samples)
    except CannotInspect:
        origin, fix = _weights(source)
        return ReferenceNote(True, None, f"{what} with {origin}, {blind}: {fix}", drift_measurable=False)
    if layers.varying is None:
        return ReferenceNote(
            True,
            None,
            f"{what} and no layer's output depends on the input, {blind}: check that the model uses its inputs",
            drift_measurable=False,
        )
    varying = layers.varying
    if source.has_own_weights:
        origin, fix = _weights(source)
        return ReferenceNote(
            True,
            varying,
            f"{what} with {origin} (a zero-initialised head? the last layer whose output varies is {varying!r}), "
            f"{blind}: {fix}",
            drift_measurable=False,
        )
    redrawn = redraw_zero_weights(model, layers.head)
    if not redrawn:
        after = ", ".join(layers.head) or "none"
        return ReferenceNote(
            True,
            varying,
            f"{what} although the output of {varying!r} varies, and the modules after it ({after}) have no "
            f"all-zero weight to redraw, {blind}: pass --weights with a trained head",
            drift_measurable=False,
        )
    return ReferenceNote(
        True,
        varying,
        f"{what} (a zero-initialised head?): drift is measured on the features before it (the output of "
        f"{varying!r}), through a seeded random redraw of {', '.join(redrawn)} in the random init every trial loads",
        redrawn=redrawn,
    )


def still_constant(note: ReferenceNote, all_zero: bool) -> ReferenceNote:
    """The note when the outputs stay constant even after the redraw."""
    return ReferenceNote(
        True,
        note.varying_layer,
        f"the FP32 outputs are {_what(all_zero)} even with {', '.join(note.redrawn)} redrawn at random, although "
        f"the output of {note.varying_layer!r} varies, so drift cannot tell a broken numerics from a correct one: "
        "pass --weights with a trained head",
        redrawn=note.redrawn,
        drift_measurable=False,
    )
