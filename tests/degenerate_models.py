"""Models whose FP32 outputs are the same for every input (a zero-initialised head, or no use of the
input at all), for the tests of a reference that carries no information."""

import torch
from torch import nn
from torchvision.models.vision_transformer import VisionTransformer


class ZeroHead(nn.Module):
    """A small CNN whose classifier starts at zero (as torchvision's vision transformers' does), and
    whose features are deliberately wrong (negated) when it runs in bf16: broken numerics that a
    zero head hides from drift."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1, stride=2),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.head = nn.Linear(32, classes)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.features(x)
        if features.dtype == torch.bfloat16:
            features = -features
        return self.head(features)


class IgnoresInput(nn.Module):
    """Answers the same whatever the input: no layer's output depends on it."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.zeros(x.shape[0], 8))


def zero_head() -> nn.Module:
    return ZeroHead()


def tiny_vit() -> nn.Module:
    """torchvision's ViT, tiny: its head is zero-initialised, as vit_b_16's is."""
    return VisionTransformer(image_size=16, patch_size=8, num_layers=1, num_heads=2, hidden_dim=16, mlp_dim=32)


def ignores_input() -> nn.Module:
    return IgnoresInput()
