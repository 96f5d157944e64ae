"""Memory profiling in the training loop (issue #16): per-step statistics
(``step_stats``), growth and leak detection (``leaks``), out-of-memory
capture and its listeners (``oom``), a model's layer
summary (``model_summary``) and operators' memory and time from a
``torch.profiler`` window's structured data, never its printed table
(``operator_table``)."""

from fastprof.memory._rows import OperatorRow
from fastprof.memory.collector import collect, collected
from fastprof.memory.model_summary import LayerRow, ModelSummary, model_summary
from fastprof.memory.oom import add_oom_listener, remove_oom_listener
from fastprof.memory.operators import NO_MEMORY_NOTE, OperatorTable, operator_table
from fastprof.memory.step_stats import StepMemory
from fastprof.recording.names import CUDA_COUNTERS, RSS_COUNTER

__all__ = [
    "CUDA_COUNTERS",
    "NO_MEMORY_NOTE",
    "RSS_COUNTER",
    "LayerRow",
    "ModelSummary",
    "OperatorRow",
    "OperatorTable",
    "StepMemory",
    "add_oom_listener",
    "collect",
    "collected",
    "model_summary",
    "operator_table",
    "remove_oom_listener",
]
