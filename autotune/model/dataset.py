"""The user's data for drift and calibration: an image folder, a tensor file, or seeded synthetic inputs.

Resolved (and validated) in the orchestrator so a bad path fails early with one clear line; loaded in
the reference process, which splits it into an evaluation set and a disjoint calibration set and saves
both next to the FP32 outputs, so every trial and every artifact build reads the same tensors.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.common.errors import UserError
from autotune.common.files import file_digest
from autotune.common.json_record import Record
from autotune.model.inputs import InputSpec, as_batch, describe, take

SYNTHETIC = "synthetic"
IMAGE_FOLDER = "image-folder"
TENSOR_FILE = "tensor-file"
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".pgm", ".tif", ".tiff", ".webp")
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
SPLIT_SEED = 0


@dataclass(frozen=True)
class DataSource(Record):
    kind: str = SYNTHETIC
    path: str | None = None
    digest: str | None = None  # what the data is, whatever its path
    samples: int = 0  # how many the source holds (0: unlimited, synthetic)
    labels: bool = False

    def describe(self) -> str:
        if self.kind == SYNTHETIC:
            return "synthetic seeded random inputs"
        what = "image folder" if self.kind == IMAGE_FOLDER else "tensor file"
        return f"{what} {self.path} ({self.samples} samples, {'with' if self.labels else 'no'} labels)"


def image_files(root: Path) -> tuple[list[Path], bool]:
    """The images under `root` in a stable order, and whether they sit in class subfolders (labels)."""
    classes = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if classes:
        files = [f for c in classes for f in sorted(c.rglob("*")) if f.suffix.lower() in IMAGE_SUFFIXES]
        return files, True
    return sorted(f for f in root.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES), False


def _load_tensor_file(path: Path) -> tuple[tuple[Any, ...], Any]:
    """(inputs batch, labels or None) from a tensor file: a tensor, or a dict with 'inputs' (a tensor, a
    tuple of tensors or a dict of them, one per model input) and maybe 'labels'."""
    import torch

    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # unpickling refused, truncated file, not a torch file
        raise UserError(
            f"cannot read data file {str(path)!r} ({type(exc).__name__}); save a tensor or "
            "{'inputs': tensor, 'labels': tensor} with torch.save"
        ) from None
    if isinstance(data, torch.Tensor):
        return (data,), None
    inputs = as_batch(data.get("inputs")) if isinstance(data, dict) and data.get("inputs") is not None else ()
    if inputs and all(isinstance(t, torch.Tensor) for t in inputs) and len({len(t) for t in inputs}) == 1:
        labels = data.get("labels")
        if labels is not None and (not isinstance(labels, torch.Tensor) or len(labels) != len(inputs[0])):
            raise UserError(f"data file {str(path)!r}: 'labels' must be a tensor with one label per input")
        return inputs, labels
    raise UserError(
        f"data file {str(path)!r} holds {type(data).__name__}; save a tensor or {{'inputs': tensor, 'labels': tensor}}"
    )


def resolve_data(path: str | None, specs: tuple[InputSpec, ...], option: str = "--data") -> DataSource:
    """Check what the user pointed at and describe it; synthetic when nothing was given."""
    if path is None:
        return DataSource()
    target = Path(path).expanduser()
    if not target.exists():
        raise UserError(
            f"{option} {path!r} does not exist: give an image folder (one subfolder per class) or a tensor file"
        )
    target = target.resolve()
    if target.is_dir():
        if len(specs) != 1:
            raise UserError(
                f"{option} {path!r} is an image folder, but the model takes {len(specs)} inputs: give a tensor file"
            )
        files, labelled = image_files(target)
        if not files:
            raise UserError(
                f"{option} {path!r} has no images ({', '.join(IMAGE_SUFFIXES[:3])}, ...) in it or in its class "
                "subfolders"
            )
        listing = "\n".join(f"{f.relative_to(target)}:{f.stat().st_size}" for f in files)
        return DataSource(IMAGE_FOLDER, str(target), hashlib.sha256(listing.encode()).hexdigest(), len(files), labelled)
    inputs, labels = _load_tensor_file(target)
    found = [tuple(t.shape[1:]) for t in inputs]
    if found != [tuple(s.shape) for s in specs]:
        raise UserError(
            f"{option} {path!r}: samples have shape {', '.join('x'.join(map(str, f)) for f in found)}, "
            f"the model's input is {describe(specs)} (change --input-shape or the data)"
        )
    return DataSource(TENSOR_FILE, str(target), file_digest(str(target)), len(inputs[0]), labels is not None)


def check_sizes(data: DataSource, calibration: DataSource | None, eval_samples: int, calibration_samples: int) -> None:
    """The evaluation and calibration sets must fit, disjoint, in the data."""
    if data.kind == SYNTHETIC:
        return
    needed = eval_samples + (calibration_samples if calibration is None or calibration == data else 0)
    if data.samples < needed:
        raise UserError(
            f"--data has {data.samples} samples, but --eval-samples {eval_samples}"
            f"{f' + --calibration-samples {calibration_samples}' if needed > eval_samples else ''} "
            f"need {needed} (the two sets are disjoint): lower them or add data"
        )
    if calibration is not None and calibration != data and calibration.samples < calibration_samples:
        raise UserError(
            f"--calibration-data has {calibration.samples} samples, fewer than --calibration-samples "
            f"{calibration_samples}"
        )


def image_transform(model: Any) -> Any:
    """The model's standard preprocessing: its torchvision weights' transforms, else resize + ImageNet
    normalisation (grayscale for one channel) to the model's input shape."""
    from torchvision import transforms

    if model.kind == "torchvision":
        import torchvision

        try:
            return torchvision.models.get_model_weights(model.name).DEFAULT.transforms()
        except (ValueError, AttributeError):
            pass
    channels, height, width = model.input_shape[0], model.input_shape[-2], model.input_shape[-1]
    steps = [transforms.Resize((height, width)), transforms.ToTensor()]
    if channels == 1:
        steps.insert(0, transforms.Grayscale(1))
        return transforms.Compose(steps)
    return transforms.Compose([*steps, transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)])


def load_samples(data: DataSource, model: Any, indices: list[int]) -> tuple[tuple[Any, ...], Any]:
    """The selected samples as a batch (preprocessed; each input in its spec's dtype), and their labels (or None)."""
    import torch

    assert data.path is not None  # a tensor file or an image folder
    if data.kind == TENSOR_FILE:
        inputs, labels = _load_tensor_file(Path(data.path))
        picked = torch.as_tensor(indices, dtype=torch.long)
        batch = tuple(t[picked].to(getattr(torch, spec.dtype)) for t, spec in zip(inputs, model.specs))
        return batch, None if labels is None else labels[picked].long()
    from PIL import Image

    files, labelled = image_files(Path(data.path))
    classes = sorted({f.parent.name for f in files}) if labelled else []
    transform = image_transform(model)
    images = [transform(Image.open(files[i]).convert("L" if model.input_shape[0] == 1 else "RGB")) for i in indices]
    stacked = torch.stack(images)
    if tuple(stacked.shape[1:]) != tuple(model.input_shape):
        raise ValueError(
            f"preprocessed images have shape {tuple(stacked.shape[1:])}, the model takes {tuple(model.input_shape)}"
        )
    labels = torch.as_tensor([classes.index(files[i].parent.name) for i in indices]) if labelled else None
    return (stacked,), labels


def split(total: int, eval_samples: int, calibration_samples: int) -> tuple[list[int], list[int]]:
    """Disjoint evaluation and calibration indices from one seeded shuffle of the data."""
    import torch

    order = torch.randperm(total, generator=torch.Generator().manual_seed(SPLIT_SEED)).tolist()
    return order[:eval_samples], order[eval_samples : eval_samples + calibration_samples]


def evaluation_and_calibration(
    data: DataSource,
    calibration: DataSource | None,
    model: Any,
    eval_samples: int,
    calibration_samples: int,
    synthetic: Any,
) -> dict[str, Any]:
    """What the reference process saves: eval inputs (+ labels) and calibration inputs, disjoint.

    `calibration` is a separate source (None: a split of `data`); `synthetic(count, purpose)` makes
    seeded random inputs when `data` is synthetic. Each source is read once.
    """
    separate = calibration is not None and calibration != data
    calibration_inputs = None
    if data.kind == SYNTHETIC:
        inputs, labels = synthetic(eval_samples, "eval"), None
        if not separate:
            calibration_inputs = synthetic(calibration_samples, "calibration")
    else:
        eval_idx, calib_idx = split(data.samples, eval_samples, 0 if separate else calibration_samples)
        batch, all_labels = load_samples(data, model, eval_idx + calib_idx)
        head, tail = slice(0, len(eval_idx)), slice(len(eval_idx), None)
        inputs, labels = take(batch, head), None if all_labels is None else all_labels[head]
        if not separate:
            calibration_inputs = take(batch, tail)
    if separate and calibration is not None:
        calibration_inputs = load_samples(calibration, model, split(calibration.samples, 0, calibration_samples)[1])[0]
    return {"inputs": inputs, "labels": labels, "calibration": calibration_inputs}
