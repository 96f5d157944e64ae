"""Memory profiling: a model's layer summary and operators' memory and time.

``model_summary`` walks a model's modules; ``operator_table`` reads a finished
``torch.profiler`` window's structured data (never its printed table).
"""

from fastprof.memory._rows import OperatorRow
from fastprof.memory.model_summary import LayerRow, ModelSummary, model_summary
from fastprof.memory.operators import NO_MEMORY_NOTE, OperatorTable, operator_table

__all__ = [
    "NO_MEMORY_NOTE",
    "LayerRow",
    "ModelSummary",
    "OperatorRow",
    "OperatorTable",
    "model_summary",
    "operator_table",
]
