"""Memory profiling in the training loop (issue #16): per-step statistics."""

from fastprof.memory.step_stats import CUDA_COUNTERS, RSS_COUNTER, StepMemory

__all__ = ["CUDA_COUNTERS", "RSS_COUNTER", "StepMemory"]
