"""Built-in training workload: a small CNN on synthetic CIFAR-shaped data.

Used by ``fastprof demo`` and by the benchmarks, so that what the demo shows
and what the benchmarks measure are the same loop. Needs torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastprof._package import pip_install


def import_torch() -> Any:
    """torch: the command line's one import of it (this workload's, and
    ``fastprof doctor``'s check), never at a module's top, since ``fastprof
    run`` loads the command line into a job that may not use torch."""
    import torch

    return torch


def require_torch() -> Any:
    try:
        return import_torch()
    except ImportError:
        raise SystemExit(
            f"fastprof: this needs PyTorch, which is not installed; install it with: {pip_install('torch')}"
        ) from None


@dataclass
class Workload:
    model: Any
    optimizer: Any
    loss_fn: Any
    batches: list[tuple[Any, Any]]
    device: Any


def make_cnn(num_classes: int = 10) -> Any:
    """A small ResNet-ish CNN for 3x32x32 inputs."""
    torch = require_torch()
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 8 * 8, 128),
        nn.ReLU(),
        nn.Linear(128, num_classes),
    )


def make_workload(batch_size: int = 32, num_batches: int = 8, device: str | None = None, seed: int = 0) -> Workload:
    """Model, optimizer and a fixed pool of synthetic batches (cycled by the loop)."""
    torch = require_torch()
    torch.manual_seed(seed)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model = make_cnn().to(dev)
    batches = [(torch.randn(batch_size, 3, 32, 32), torch.randint(0, 10, (batch_size,))) for _ in range(num_batches)]
    return Workload(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
        loss_fn=torch.nn.CrossEntropyLoss(),
        batches=batches,
        device=dev,
    )
