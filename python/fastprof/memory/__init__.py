"""Memory profiling: a model's layer summary and operators' memory and time.

``model_summary`` walks a model's modules; ``operator_table`` reads a finished
``torch.profiler`` window's structured data (never its printed table).
"""

from fastprof.memory.model_summary import LayerRow, ModelSummary, model_summary

__all__ = ["LayerRow", "ModelSummary", "model_summary"]
