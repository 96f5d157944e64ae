"""A model's layers to a depth: parameters, trainable share, bytes, output shapes.

``model_summary(model, depth=2, example_input=None)`` walks ``named_modules()``
itself (no torchinfo: see docs/memory.md, "Model summary"). Each row counts
its whole subtree; tied parameters (one ``Parameter`` reachable under two
names) are counted once in the totals and listed in ``tied``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastprof.memory._files import write_atomic
from fastprof.recording.names import MODEL_SUMMARY_JSON

if TYPE_CHECKING:
    import torch

SCHEMA = "fastprof.model_summary"
VERSION = 1

# How deep an output's description goes into nested tuples/dicts, and how many
# items of one container it lists: a model returning 1,000 tensors gets a
# readable summary, not a 1,000-item cell.
_SHAPE_DEPTH = 4
_SHAPE_ITEMS = 16


@dataclass
class LayerRow:
    """One module of the summary.

    ``params``, ``trainable``, ``param_bytes`` and ``buffer_bytes`` count the
    module's whole subtree (its own tensors and every descendant's, each
    ``Parameter`` once within the subtree); ``own_params`` counts only the
    tensors registered on the module itself. ``percent`` is ``params`` over the
    model's total. ``output_shape`` is the first call's output during the
    example forward (``None`` without an example input or when the module was
    not called); ``calls`` how many times it ran in that forward.
    """

    name: str
    type: str
    depth: int
    params: int
    own_params: int
    trainable: int
    percent: float
    param_bytes: int
    buffer_bytes: int
    output_shape: Any = None
    calls: int | None = None


@dataclass
class ModelSummary:
    """The result of :func:`model_summary`; ``rows[0]`` is the model itself (depth 0)."""

    model: str
    depth: int
    rows: list[LayerRow]
    totals: dict[str, int]
    tied: list[dict[str, Any]] = field(default_factory=list)
    example_input: bool = False

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (shapes are lists of ints)."""
        return {
            "schema": SCHEMA,
            "version": VERSION,
            "model": self.model,
            "depth": self.depth,
            "aggregation": "each row counts its module's whole subtree; own_params only its own tensors",
            "example_input": self.example_input,
            "totals": dict(self.totals),
            "tied": [dict(t) for t in self.tied],
            "rows": [asdict(r) for r in self.rows],
        }

    def text(self) -> str:
        """An aligned plain-text table with the totals under it."""
        shapes = self.example_input
        head = ["Layer", "Type"] + (["Output shape"] if shapes else []) + ["Params", "Trainable", "%", "Param bytes"]
        head.append("Buffer bytes")
        lines: list[list[str]] = []
        for r in self.rows:
            label = ("  " * r.depth) + (r.name or "(model)")
            cells = [label, r.type]
            if shapes:
                cells.append("-" if r.calls == 0 else _shape_text(r.output_shape))
            cells += [f"{r.params:,}", f"{r.trainable:,}", f"{r.percent:.1f}", _bytes_text(r.param_bytes)]
            cells.append(_bytes_text(r.buffer_bytes))
            lines.append(cells)
        widths = [max(len(c) for c in col) for col in zip(head, *lines, strict=False)]
        numeric = set(range(len(head) - 5, len(head)))

        def fmt(cells: list[str]) -> str:
            out = [
                c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            ]
            return "  ".join(out).rstrip()

        rule = "-" * len(fmt(head))
        t = self.totals
        body = [fmt(head), rule, *(fmt(c) for c in lines), rule]
        body.append(f"Total parameters:      {t['params']:,}")
        body.append(f"Trainable parameters:  {t['trainable']:,}")
        body.append(f"Non-trainable:         {t['non_trainable']:,}")
        body.append(f"Parameter bytes:       {_bytes_text(t['param_bytes'])} ({t['param_bytes']:,} B)")
        body.append(f"Buffer bytes:          {_bytes_text(t['buffer_bytes'])} ({t['buffer_bytes']:,} B)")
        for tie in self.tied:
            body.append(f"Tied (counted once):   {' = '.join(tie['names'])} ({tie['numel']:,})")
        body.append("Rows count each module's whole subtree.")
        return "\n".join(body) + "\n"

    def write(self, directory: str | Path) -> tuple[Path, Path]:
        """Write ``model_summary.json`` and ``model_summary.txt`` into ``directory``
        (created if missing), each through a temporary name and a rename."""
        d = Path(directory)
        j = write_atomic(d / MODEL_SUMMARY_JSON, json.dumps(self.to_dict(), indent=1) + "\n")
        t = write_atomic(d / "model_summary.txt", self.text())
        return j, t


def model_summary(model: torch.nn.Module, depth: int = 2, example_input: Any = None) -> ModelSummary:
    """Summarise ``model``'s modules down to ``depth`` levels of ``named_modules()``.

    ``example_input``: a tensor (``model(x)``), a tuple (``model(*x)``; wrap a
    tuple argument as ``(t,)``) or a dict (``model(**x)``). With one, the model
    runs once under ``torch.no_grad()`` in eval mode (so batch-norm statistics
    do not move) with a forward hook on every summarised module; the hooks are
    removed and every module's training flag restored afterwards, also when the
    forward raises (the exception then propagates unchanged).
    """
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 0:
        raise ValueError(f"model_summary: depth must be an int >= 0, got {depth!r}")
    chosen = [(name, m) for name, m in model.named_modules() if _depth(name) <= depth]

    outputs: dict[int, Any] = {}
    calls: dict[int, int] = {}
    if example_input is not None:
        _run_example(model, chosen, example_input, outputs, calls)

    # Each Parameter once (by identity), under the first name named_parameters meets it by.
    uniq = dict(_unique(model.parameters()))
    total = sum(p.numel() for p in uniq.values())
    trainable = sum(p.numel() for p in uniq.values() if p.requires_grad)
    param_bytes = sum(p.numel() * p.element_size() for p in uniq.values())
    buffer_bytes = sum(b.numel() * b.element_size() for _, b in _unique(model.buffers()))

    rows = []
    for name, m in chosen:
        ps = [p for _, p in _unique(m.parameters())]
        n = sum(p.numel() for p in ps)
        rows.append(
            LayerRow(
                name=name,
                type=type(m).__name__,
                depth=_depth(name),
                params=n,
                own_params=sum(p.numel() for _, p in _unique(m.parameters(recurse=False))),
                trainable=sum(p.numel() for p in ps if p.requires_grad),
                percent=round(100.0 * n / total, 3) if total else 0.0,
                param_bytes=sum(p.numel() * p.element_size() for p in ps),
                buffer_bytes=sum(b.numel() * b.element_size() for _, b in _unique(m.buffers())),
                output_shape=outputs.get(id(m)),
                calls=calls.get(id(m), 0) if example_input is not None else None,
            )
        )

    groups: dict[int, list[str]] = {}
    for pname, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(pname)
    tied = [{"names": names, "numel": uniq[k].numel()} for k, names in groups.items() if len(names) > 1]

    return ModelSummary(
        model=type(model).__name__,
        depth=depth,
        rows=rows,
        totals={
            "params": total,
            "trainable": trainable,
            "non_trainable": total - trainable,
            "param_bytes": param_bytes,
            "buffer_bytes": buffer_bytes,
        },
        tied=tied,
        example_input=example_input is not None,
    )


def _depth(name: str) -> int:
    return 0 if name == "" else name.count(".") + 1


def _unique(tensors: Iterator[torch.Tensor]) -> Iterator[tuple[int, torch.Tensor]]:
    seen: set[int] = set()
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            yield id(t), t


def _run_example(
    model: torch.nn.Module,
    chosen: list[tuple[str, torch.nn.Module]],
    example_input: Any,
    outputs: dict[int, Any],
    calls: dict[int, int],
) -> None:
    no_grad = _torch().no_grad

    def hook(module: torch.nn.Module, _args: Any, out: Any) -> None:
        key = id(module)
        calls[key] = calls.get(key, 0) + 1
        if key not in outputs:
            outputs[key] = _describe(out, 0)

    modes = [(m, m.training) for m in model.modules()]
    handles = []
    try:
        for _, m in chosen:
            handles.append(m.register_forward_hook(hook))
        model.eval()
        with no_grad():
            if isinstance(example_input, dict):
                model(**example_input)
            elif isinstance(example_input, tuple):
                model(*example_input)
            else:
                model(example_input)
    finally:
        for h in handles:
            h.remove()
        for m, was in modes:
            m.training = was


def _torch() -> Any:
    """The job's torch: a model is a ``torch.nn.Module``, so torch is imported already."""
    return sys.modules["torch"]


def _describe(x: Any, level: int) -> Any:
    """An output as JSON: a tensor's shape as a list of ints, containers as lists/dicts of those."""
    if isinstance(x, _torch().Tensor):
        return list(x.shape)
    if level >= _SHAPE_DEPTH:
        return "..."
    if isinstance(x, (list, tuple)):
        items = [_describe(v, level + 1) for v in list(x)[:_SHAPE_ITEMS]]
        return items + (["..."] if len(x) > _SHAPE_ITEMS else [])
    if isinstance(x, dict):
        return {str(k): _describe(v, level + 1) for k, v in list(x.items())[:_SHAPE_ITEMS]}
    return None if x is None else type(x).__name__


def _shape_text(s: Any) -> str:
    if s is None:
        return "-"
    if isinstance(s, list) and all(isinstance(v, int) for v in s):
        return "[" + ", ".join(str(v) for v in s) + "]"
    return json.dumps(s, separators=(",", ":"))


def _bytes_text(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"
