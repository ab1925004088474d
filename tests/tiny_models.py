"""Tiny models for tests: fast to build, and a few that misbehave on purpose (real faults, no mocks)."""

import ctypes
import os
import sys
import time

import torch
from torch import nn


class TinyCNN(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1, stride=2),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.head = nn.Linear(32, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


BAD_BATCH = 4  # the faulty models misbehave only at this batch size, so the FP32 reference still runs


class Crashing(TinyCNN):
    """Aborts the process (a native crash, SIGABRT) on a batch of BAD_BATCH."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == BAD_BATCH:
            os.abort()
        return super().forward(x)


class MissingPackage(TinyCNN):
    """Raises what transformers raises for a package the environment lacks, its message starting with a
    newline, on a batch of BAD_BATCH."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == BAD_BATCH:
            raise ImportError("\n requires the protobuf library but it was not found in your environment.\n")
        return super().forward(x)


class Hanging(TinyCNN):
    """Never returns from a forward on a batch of BAD_BATCH."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        while x.shape[0] == BAD_BATCH:
            time.sleep(1)
        return super().forward(x)


PACE_S = 0.004


class Paced(TinyCNN):
    """Sleeps PACE_S in every call: a floor on the call time known in advance, which a throughput can be
    checked against (a sleep needs no CPU, so other load on the machine barely moves it)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(PACE_S)
        return super().forward(x)


def tiny_cnn() -> nn.Module:
    return TinyCNN()


def paced() -> nn.Module:
    return Paced()


def tiny_mlp() -> nn.Module:
    """Linear layers only (64 features in): what runs them differs from what runs convolutions."""
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


def tiny_vit() -> nn.Module:
    """torchvision's VisionTransformer, the code vit_b_16 runs (MultiheadAttention, LayerNorm, GELU), on
    3x32x32 with two layers; its zero-initialised head drawn again, so the outputs vary with the input."""
    from torchvision.models import VisionTransformer

    torch.manual_seed(0)
    model = VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=64, mlp_dim=128, num_classes=10
    )
    nn.init.normal_(model.heads.head.weight, std=0.02)
    return model


def crashing() -> nn.Module:
    return Crashing()


def missing_package() -> nn.Module:
    return MissingPackage()


def hanging() -> nn.Module:
    return Hanging()


class Segfaulting(TinyCNN):
    """Reads address 0 (SIGSEGV) on a batch of BAD_BATCH."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == BAD_BATCH:
            ctypes.string_at(0)
        return super().forward(x)


class SilentExit(TinyCNN):
    """Prints garbage and leaves with exit code 0 without writing a result, on a batch of BAD_BATCH."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == BAD_BATCH:
            sys.stdout.buffer.write(bytes(range(256)))
            sys.stdout.flush()
            os._exit(0)
        return super().forward(x)


class MemoryHog(TinyCNN):
    """Keeps 200 MB more on every call at a batch of BAD_BATCH: runaway memory."""

    def __init__(self) -> None:
        super().__init__()
        self.hoard: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == BAD_BATCH:
            self.hoard.append(torch.ones(50_000_000))
        return super().forward(x)


class DiesOnLastCpu(TinyCNN):
    """Aborts only in a process pinned to the single last CPU its parent may use: with two one-core
    instances, instance 1 dies while instance 0 runs on."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mine = os.sched_getaffinity(0)
        if len(mine) == 1 and mine == {max(os.sched_getaffinity(os.getppid()))}:
            os.abort()
        return super().forward(x)


def segfaulting() -> nn.Module:
    return Segfaulting()


def silent_exit() -> nn.Module:
    return SilentExit()


def memory_hog() -> nn.Module:
    return MemoryHog()


def dies_on_last_cpu() -> nn.Module:
    return DiesOnLastCpu()


class SlowAtBadBatch(TinyCNN):
    """Takes 50 ms longer per call on a batch of BAD_BATCH: a config that is clearly slower, for real."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == BAD_BATCH:
            time.sleep(0.05)
        return super().forward(x)


def slow_at_bad_batch() -> nn.Module:
    return SlowAtBadBatch()


class CrawlsInBf16(TinyCNN):
    """Takes a whole second per call under bf16 autocast: hundreds of times slower than tiny_cnn, as
    emulated bf16 can be against native int8, in a configuration whose numerics differ from the baseline's
    (so its drift is measured, not reused)."""

    SECONDS_PER_CALL = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_autocast_enabled("cpu"):
            time.sleep(self.SECONDS_PER_CALL)
        return super().forward(x)


def crawls_in_bf16() -> nn.Module:
    return CrawlsInBf16()


class CrawlsSixSecondsInBf16(CrawlsInBf16):
    """Six seconds per call under bf16 autocast: so slow that the warm-up's three calls at least outlast the
    speed gate's 10 s, as a 47 s call of ONNX Runtime fp32 vit_b_16 at batch 64 on one thread does."""

    SECONDS_PER_CALL = 6.0


def crawls_6s_in_bf16() -> nn.Module:
    return CrawlsSixSecondsInBf16()


class DigitsNet(nn.Module):
    """A small CNN for scikit-learn's 8x8 digits (1x8x8 inputs in [0, 1], 10 classes)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1, stride=2),
            nn.ReLU(),
            nn.Flatten(),
        )
        self.head = nn.Linear(32 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def digits_net() -> nn.Module:
    return DigitsNet()


class SentenceEncoder(nn.Module):
    """A BERT-style text encoder (random weights from a transformers config): token ids and attention
    mask in, the [CLS] embedding out."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import BertConfig, BertModel

        config = BertConfig(
            vocab_size=1000,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=128,
            max_position_embeddings=64,
        )
        self.bert = BertModel(config, add_pooling_layer=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state[:, 0]


def sentence_encoder() -> nn.Module:
    return SentenceEncoder()


def sentence_encoder_with_example() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """A factory that also says what the model takes: autotune reads the input specs from the example."""
    return SentenceEncoder(), {
        "input_ids": torch.randint(0, 1000, (2, 32)),
        "attention_mask": torch.ones(2, 32, dtype=torch.long),
    }


SERVICE_S = 0.002


class ServiceTimed(nn.Module):
    """A call that costs SERVICE_S of wall time, whatever the batch, and almost nothing else: a server whose
    service time is known, so queueing theory gives the rate it sustains at a p99 bound. It spins on the
    clock rather than sleeping: a sleep's wake-up on a shared machine added 0.2-0.6 ms, more after an idle
    gap than back to back, so the service time depended on the load being measured."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        end = time.monotonic() + SERVICE_S
        while time.monotonic() < end:
            pass
        return self.head(x)


def service_timed() -> nn.Module:
    return ServiceTimed()


class BlocksAtTeardown:
    """Stands in for a native handle whose destructor never returns (OpenVINO's async infer queue
    did so once at the end of a finalist run); blocks only inside a worker process."""

    def __del__(self) -> None:
        if "autotune.worker" in sys.orig_argv:
            time.sleep(3600)


def blocks_at_teardown() -> nn.Module:
    model = TinyCNN()
    model.handle = BlocksAtTeardown()
    return model


BUSY_CHILD_S = 3.0


def spawns_busy_child(seconds: float = BUSY_CHILD_S) -> nn.Module:
    """The tiny CNN, from a factory that starts a process of its own spinning a CPU for `seconds`, as
    importing IPEX starts torch inductor's compile-worker pool (processes importing torch at full speed for
    seconds): the trial's own work beside its calls, inheriting its pinning, not another program's."""
    import subprocess
    import sys

    spin = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass"
    subprocess.Popen([sys.executable, "-c", spin])
    return TinyCNN()


def spawns_long_busy_child() -> nn.Module:
    """The same with a process busy for longer than any warm-up here waits: it spins through the window."""
    return spawns_busy_child(30.0)
