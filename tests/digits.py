"""A real classifier trained in seconds on data that ships with scikit-learn (8x8 handwritten digits).

The held-out part (never seen in training) is saved as the tensor file autotune evaluates and
calibrates on; the trained weights as a state_dict.
"""

from __future__ import annotations

from pathlib import Path

import torch
from sklearn.datasets import load_digits
from tiny_models import DigitsNet

TRAIN = 1000  # of 1797 digits; the other 797 are held out


def digits_tensors() -> tuple[torch.Tensor, torch.Tensor]:
    digits = load_digits()
    inputs = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    return inputs, torch.tensor(digits.target, dtype=torch.long)


def train_digits(workdir: Path, epochs: int = 20) -> dict[str, Path | float]:
    """Train DigitsNet (full batch, Adam), save weights and the held-out data; return paths and accuracy."""
    torch.manual_seed(0)
    inputs, labels = digits_tensors()
    order = torch.randperm(len(inputs), generator=torch.Generator().manual_seed(0))
    train, held_out = order[:TRAIN], order[TRAIN:]
    model = DigitsNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(epochs):
        for batch in train.split(100):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(inputs[batch]), labels[batch])
            loss.backward()
            optimizer.step()
    model.eval()
    with torch.no_grad():
        accuracy = float((model(inputs[held_out]).argmax(1) == labels[held_out]).float().mean())
    weights, data = workdir / "digits_weights.pt", workdir / "digits_data.pt"
    torch.save(model.state_dict(), weights)
    torch.save({"inputs": inputs[held_out].clone(), "labels": labels[held_out].clone()}, data)
    return {"weights": weights, "data": data, "accuracy": accuracy}


def garbage_calibration(workdir: Path, samples: int = 200) -> Path:
    """Inputs 1000x outside the real range: int8 calibrated on them quantizes real digits to zero."""
    generator = torch.Generator().manual_seed(1)
    path = workdir / "garbage.pt"
    torch.save(torch.rand((samples, 1, 8, 8), generator=generator) * 1000.0, path)
    return path
