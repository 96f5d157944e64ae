"""Always-on step anatomy on the host (issue #25): where each step's time
goes on the training thread, at every step, with no torch.profiler window.

Each phase is a span on the training thread's timeline, recorded by the core
as one complete event (begin ticks taken at entry, the record pushed at exit:
an exception inside a phase still closes it):

- ``phase.forward``: the outermost module call (global forward hooks learn
  which modules are called at depth 0 for a bounded while, then only those
  modules are timed, by their class's ``__call__``: see :class:`_Forward`);
- ``phase.backward``: ``torch.autograd.backward`` (which ``Tensor.backward``
  calls), entry to exit (autograd runs the whole backward pass inside it);
- ``phase.optimizer``: the optimizer's step (torch's global step pre/post
  hooks) and ``Optimizer.zero_grad``;
- ``phase.communication``: a ``torch.distributed`` collective called from
  Python, with its op, bytes, process group size and a per-group sequence
  number (the collectives DDP's reducer runs inside backward are backward's),
  and the host's wait on an async collective's ``Work.wait()`` (op
  ``wait``); a collective or wait inside a timed collective is that one's.

``dataloader`` is the train loader's wait (``loader.train.next``, recorded by
the step loop) and ``other`` what is left of the step. The report
(:mod:`fastprof.reports.anatomy`) also counts the user's own spans named
``forward``, ``backward`` and ``optimizer`` as those phases.

Where the job uses CUDA, each phase's time on the GPU is measured too, with
CUDA events recorded on the current stream at the phase's host begin and end
(:class:`_GpuPhases`): on a GPU-bound step the host spans only show the
launches (forward 4.7 ms on the host against 10.7 ms on the GPU, measured on
an H200). Events cost ~10 µs each to record there, so whole steps are timed
within a budget: a step is timed only when 100 timed steps' cost has passed
since the previous one (~1% of the training thread). A timed step's phases
are read once its events have completed (never waiting: ``query()``), a step
or more later, as two counter events at one time: ``phase.gpu.step`` (the
timed step's number) and ``phase.gpu [ms]`` (each phase's GPU milliseconds
and ``span``, first phase begin to last phase end on the GPU).

Only the training thread's calls are recorded (a DataLoader thread's or an
evaluation thread's modules are not the step's). A hook never raises into
the job: a phase it cannot record is left out, and counted in
:attr:`Anatomy.status` (``profiler.json``'s ``anatomy``).
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import threading
import time
import warnings
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

from fastprof import _core
from fastprof.profiler import collectives
from fastprof.profiler.slow_phase import slow_phase
from fastprof.recording.budget import moving_cost
from fastprof.recording.names import (
    BACKWARD_GRADS_SPAN,
    GPU_PHASE_COUNTER,
    GPU_PHASE_STEP_COUNTER,
    PHASE_SPANS,
    PHASES,
)

__all__ = ["GPU_COUNTER", "GPU_STEP_COUNTER", "PHASES", "Anatomy"]

#: The counter each timed step's GPU phase times are recorded in (ms), and the
#: counter recorded just before it with the timed step's number.
GPU_COUNTER = GPU_PHASE_COUNTER
GPU_STEP_COUNTER = GPU_PHASE_STEP_COUNTER

#: The phases the hooks time, in the order of a step's row of times
#: (:meth:`Anatomy.recent`): a row is a list indexed by these.
TIMED = ("forward", "backward", "optimizer", "communication")
COMMUNICATION = 3
#: A timed phase made a slow step slow only when its time over its median is
#: at least this share of the step's over the median step (issue #36: a rank
#: that slept 300 ms before a collective whose own wait was 10 ms over its
#: median, 5.6x, was said to be slow in communication).
PHASE_SHARE = 0.5

_get_ident = threading.get_ident

#: torch.distributed's collectives (and point-to-point calls the host waits
#: on) timed as communication.
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
)


#: Each process group's collective wavefront is recorded for the hang
#: diagnosis (:mod:`fastprof.profiler.collectives`); False: not recorded
#: (``benches/bench_collectives.py`` measures the record's cost so).
WAVEFRONT = True


class _NoLoop:
    """The step loop before :meth:`Anatomy.follow`: no step."""

    batch = None


def _group_key(dist: Any, group: Any) -> tuple[str, int]:
    """A process group's key, the same on every rank ("default", or its
    global ranks), and its size."""
    if not dist.is_initialized():
        return "default", 1
    size = int(dist.get_world_size(group))
    if group is None or group is getattr(dist.GroupMember, "WORLD", None):
        return "default", size
    ranks = dist.get_process_group_ranks(group)
    return "ranks " + ",".join(str(r) for r in ranks), size


def _nbytes(x: Any) -> int:
    """Bytes of a tensor, or of a list of tensors; 0 for anything else."""
    try:
        if isinstance(x, (list, tuple)):
            return sum(_nbytes(t) for t in x)
        return int(x.numel()) * int(x.element_size())
    except Exception:  # noqa: BLE001 - an object without a size counts none
        return 0


class Anatomy:
    """The hooks that record a step's phases on one training thread."""

    def __init__(self) -> None:
        self.thread_id = threading.get_ident()
        #: The phases' clock (the core): their begins and ends, spans and the
        #: recent steps' rows of times; the hooks below only install it.
        self._clock = _core._PhaseClock(
            [_core.name_id(PHASE_SPANS[p]) for p in TIMED], list(TIMED), _core.name_id(BACKWARD_GRADS_SPAN)
        )
        self._step_of: Callable[[], int] | None = None
        self.active = False
        #: Why there is no anatomy ("off" before start).
        self._why_not = "off"
        self._forward: _Forward | None = None
        self._undo: list[Callable[[], None]] = []
        #: Collectives per process group (by its key) and the groups seen (id ->
        #: (group, key, size)).
        self._seq: dict[str, int] = {}
        self._groups: dict[int, tuple[Any, str, int]] = {}
        #: The step loop (its ``batch``: the step a collective is in) and the
        #: step of the last collective: a step's first collective notes how
        #: many each group had before it (the hang verdict's step of a skipped
        #: collective).
        self._loop: Any = _NoLoop
        self._step: Any = None

        #: A timed collective is running (a collective or wait inside it is its own).
        self._in_collective = False
        #: Phases a failure on the host left out (their span, or their time in
        #: the step's row), and the first failure.
        self.left_out = 0
        self.left_out_first: str | None = None
        #: GPU phase times (CUDA events), where the job can use CUDA.
        self.__gpu: _GpuPhases | None = None
        self.gpu_status = "off"

    @property
    def step_of(self) -> Callable[[], int] | None:
        """The current step's number (the Profiler sets the step loop's)."""
        return self._step_of

    @step_of.setter
    def step_of(self, fn: Callable[[], int] | None) -> None:
        self._step_of = fn
        self._clock.set_steps(fn)

    def follow(self, steps: Any) -> None:
        """Number the phases' steps by the step loop's ``batch`` (read by
        the core, with no Python frame per phase)."""
        self._step_of = functools.partial(getattr, steps, "batch")
        self._clock.set_steps(steps)
        self._loop = steps

    @property
    def _gpu(self) -> _GpuPhases | None:
        return self.__gpu

    @_gpu.setter
    def _gpu(self, gpu: _GpuPhases | None) -> None:
        self.__gpu = gpu
        self._clock.set_gpu(gpu.mark if gpu is not None else None)

    @property
    def status(self) -> str:
        """What is recorded, or why not (``profiler.json``'s ``anatomy``), with
        what was left out: phases a failure on the host dropped, outermost
        modules not timed, GPU steps not recorded."""
        if self._forward is None:
            return self._why_not
        gpu = self._gpu.summary() if self._gpu is not None else self.gpu_status
        failed = f" (first: {self.left_out_first})" if self.left_out_first else ""
        return (
            f"on: forward, backward, optimizer, communication; {self._forward.summary()}; "
            f"left out: {self.left_out} phases (host failures){failed}, {self._forward.untimed()}; "
            f"GPU phase times: {gpu}"
        )

    # ------------------------------------------------------------ lifecycle

    def start(self) -> str:
        """Install the hooks if torch is imported; returns the status. Never raises."""
        if self.active:
            return self.status
        torch = sys.modules.get("torch")
        if torch is None:
            self._why_not = "waiting for torch to be imported"
            return self.status
        self.thread_id = threading.get_ident()
        self._clock.start()
        try:
            self._hook_forward(torch)
            self._hook_backward(torch)
            self._hook_optimizer(torch)
            self._hook_collectives()
        except Exception as e:  # noqa: BLE001 - an old or partial torch: no anatomy, the job goes on
            self.stop()
            self._forward = None
            self._why_not = f"unavailable: hooking torch failed ({type(e).__name__}: {e})"
            return self.status
        self.active = True
        self.gpu_status = self._start_gpu(torch)
        return self.status

    def _start_gpu(self, torch: Any) -> str:
        if os.environ.get(GPU_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
            return f"off ({GPU_ENV}=0)"
        try:
            if not torch.cuda.is_available():
                return "unavailable: no CUDA device (torch.cuda.is_available() is False)"
        except Exception as e:  # noqa: BLE001 - a broken CUDA setup is a reason, not a crash
            return f"unavailable: torch.cuda.is_available() raised {type(e).__name__}: {e}"
        self._gpu = _GpuPhases(torch, self)
        return "CUDA events, within a 1% budget"

    def stop(self) -> None:
        """Remove every hook (a patch another library made on top of ours stays)."""
        if self._gpu is not None:
            self._gpu.flush()
            self.gpu_status = self._gpu.summary()
            self._gpu = None
        undo, self._undo = self._undo, []
        for u in reversed(undo):
            try:
                u()
            except Exception:  # noqa: BLE001 - best effort at stop
                pass
        self._clock.stop()
        self.active = False

    # ------------------------------------------------------------- records

    def recent(self) -> OrderedDict[int, list[int]]:
        """The recent steps' time per phase (ticks, indexed as :data:`TIMED`), oldest first."""
        return OrderedDict((step, list(row)) for step, row in self._clock.rows())

    def _left_out(self, e: BaseException) -> None:
        self.left_out += 1
        if self.left_out_first is None:
            self.left_out_first = f"{type(e).__name__}: {e}"

    def explain(self, step: int, excess: float | None = None) -> str | None:
        """Which recorded phase made step ``step`` slow, by the report's rule
        (:func:`fastprof.profiler.slow_phase.slow_phase` over the recent
        steps): "backward 3.1x its median", or where none of them did ("not
        forward, backward, optimizer or communication: ..."). ``excess``:
        the step's time over the median step (ticks), where known; a phase
        whose own excess is under half of it did not make the step slow (the
        report, which also has the loader's wait and the rest of the step,
        names what did). None when the step is not among the recent or fewer
        than 3 others are."""
        recent = self.recent()
        row = recent.get(step)
        if row is None:
            return None
        others = [r for s, r in recent.items() if s != step]
        got = slow_phase(dict(zip(TIMED, row, strict=True)), {p: [r[i] for r in others] for i, p in enumerate(TIMED)})
        if got is None:
            return None
        if not got.stands_out or (excess is not None and got.took - got.median < PHASE_SHARE * excess):
            return "not forward, backward, optimizer or communication: the data loader's wait or the rest of the step"
        return str(got)

    # ---------------------------------------------------------------- hooks

    def _hook_forward(self, torch: Any) -> None:
        """Learn the step's outermost modules with global hooks, then time
        only those (see :class:`_Forward`)."""
        m = torch.nn.modules.module
        compiler = getattr(torch, "compiler", None)
        compiling = getattr(compiler, "is_dynamo_compiling", None) or getattr(compiler, "is_compiling", None)
        self._forward = _Forward(self, m, compiling)
        self._undo.append(self._forward.remove)

    def _hook_backward(self, torch: Any) -> None:
        # Tensor.backward calls torch.autograd.backward: one wrapper times both.
        # The core's wrapper adds no frame to the job's traceback.
        self._patch(torch.autograd, "backward", functools.partial(self._clock.wrap, "backward"))

    def _hook_optimizer(self, torch: Any) -> None:
        # torch.optim's step hooks live in the Optimizer's own module (imported
        # with torch.optim, though not always an attribute of it).
        o = sys.modules[torch.optim.Optimizer.__module__]
        # The core's hooks (no Python frame); while the forward's outermost
        # modules are being learnt, the first optimizer step settles them.
        pre, post = self._clock.optimizer_hooks()
        h1 = o.register_optimizer_step_pre_hook(pre)
        h2 = o.register_optimizer_step_post_hook(post)
        self._undo += [h1.remove, h2.remove]
        self._clock.set_on_optimizer_step(self._first_optimizer_step)
        # Inside an optimizer step (its closure), the step's span has zero_grad.
        self._patch(torch.optim.Optimizer, "zero_grad", functools.partial(self._clock.wrap, "zero_grad"))

    def _first_optimizer_step(self) -> None:
        self._clock.set_on_optimizer_step(None)
        if self._forward is not None and self._forward.learning:
            self._forward.settle("at the first optimizer step")

    def _hook_collectives(self) -> None:
        dist = sys.modules.get("torch.distributed")
        if dist is None or not getattr(dist, "is_available", lambda: False)():
            return
        for op in COLLECTIVES:
            fn = getattr(dist, op, None)
            if callable(fn):
                self._patch(dist, op, functools.partial(self._timed_collective, op, dist, _group_at(fn)))
        # An async collective (async_op=True) returns at once: the host waits in Work.wait().
        work = getattr(dist, "Work", None) or getattr(getattr(dist, "distributed_c10d", None), "Work", None)
        if isinstance(work, type) and callable(getattr(work, "wait", None)):
            self._patch(work, "wait", self._timed_wait)

    def _timed_wait(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wait(*args: Any, **kwargs: Any) -> Any:
            # Inside a collective the collective's span has it (a sync collective waits on its Work).
            if self._in_collective or _get_ident() != self.thread_id:
                return fn(*args, **kwargs)
            t0 = self._clock.begin(COMMUNICATION)
            try:
                return fn(*args, **kwargs)
            finally:
                self._done(t0, {"op": "wait"})

        return wait

    def _timed_collective(self, op: str, dist: Any, group_at: int | None, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def collective(*args: Any, **kwargs: Any) -> Any:
            if self._in_collective or _get_ident() != self.thread_id:
                return fn(*args, **kwargs)
            t0 = self._clock.begin(COMMUNICATION)
            self._in_collective = True
            at = self._comm_begin(op, dist, args, kwargs, group_at)
            try:
                return fn(*args, **kwargs)
            finally:
                self._in_collective = False
                self._comm_done(op, t0, args, at)

        return collective

    def _comm_begin(
        self, op: str, dist: Any, args: Any, kwargs: Any, group_at: int | None
    ) -> tuple[str, int, int] | None:
        """A collective begins: its group's key and size and its sequence
        number there, and its entry in the group's wavefront (for the hang
        diagnosis) with the job's call site. None where they cannot be read."""
        try:
            if "group" in kwargs:
                group = kwargs["group"]
            else:  # given by position (all_reduce(t, op, group)), or the default group
                group = args[group_at] if group_at is not None and len(args) > group_at else None
            known = self._groups.get(id(group))
            if known is None or known[0] is not group:
                known = self._groups[id(group)] = (group, *_group_key(dist, group))
            _, key, size = known
            seq = self._seq.get(key, 0) + 1
            if WAVEFRONT:
                # The call site is not looked up per call (reading the caller's
                # frame costs ~0.2 µs here): a rank stuck in a collective shows
                # its line in the stack its hang evidence holds.
                collectives.ENTERED[key] = (op, seq, None)
                step = self._loop.batch
                if step != self._step:  # the step's first collective: the counts before it
                    self._step = step
                    collectives.step_began(step, self._seq)
            self._seq[key] = seq
        except Exception as e:  # noqa: BLE001 - a collective is never failed by its timing
            self._left_out(e)
            return None
        return key, size, seq

    def _comm_done(self, op: str, t0: int, args: Any, at: tuple[str, int, int] | None) -> None:
        if at is None:
            return
        key, size, seq = at
        try:
            if WAVEFRONT:
                collectives.COMPLETED[key] = (op, seq, None)
            nbytes = _nbytes(args[0]) if args else 0
        except Exception as e:  # noqa: BLE001 - a collective is never failed by its timing
            self._left_out(e)
            return
        self._done(t0, {"op": op, "bytes": nbytes, "group_size": size, "seq": seq})

    def _done(self, t0: int, args: dict[str, Any]) -> None:
        """A communication phase ended: its span and its time in the step's row. Never raises."""
        try:
            self._clock.done_with(COMMUNICATION, t0, args)
        except Exception as e:  # noqa: BLE001 - the phase is left out, the job goes on
            self._left_out(e)

    def _patch(self, owner: Any, attr: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        original = getattr(owner, attr)
        ours = wrap(original)
        setattr(owner, attr, ours)

        def undo() -> None:
            if getattr(owner, attr, None) is ours:
                setattr(owner, attr, original)

        self._undo.append(undo)


#: The learning of the outermost modules ends at the first optimizer step,
#: or after this many depth-0 module calls, or after this many steps,
#: whichever comes first (a job with no ``torch.optim`` step, or with many
#: outermost modules, must not keep the global hooks: they cost every call).
LEARN_CALLS = 64
LEARN_STEPS = 3
#: Outermost modules timed at most (more are counted, not timed).
MAX_ROOTS = 16


def _ranks() -> int:
    """The default process group's ranks (1: none, or torch not imported)."""
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return 1
        return int(dist.get_world_size())
    except Exception:  # noqa: BLE001 - a group being torn down
        return 1


def _inert_hook(*_args: Any) -> None:
    """What a timing hook becomes in a copy or pickle of the module."""


class _Hook:
    """A forward hook on an outermost module: picklable and deep-copyable
    (as an inert hook), so that ``torch.save(model)`` and
    ``copy.deepcopy(model)`` work while it is installed."""

    def __init__(self, fn: Callable[..., None]) -> None:
        self.fn = fn

    def __call__(self, *args: Any) -> None:
        self.fn(*args)

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return (_get_inert, ())


def _get_inert() -> Callable[..., None]:
    return _inert_hook


def _not_compiling() -> bool:
    return False


#: What a class's ``__dict__`` had under ``__call__`` before it was timed: nothing.
_MISSING = object()


class _Forward:
    """``phase.forward``: the outermost module call of the training thread.

    A global forward hook runs for every module call (torch then takes its
    slow call path: ~5 µs a call measured here), so global hooks only learn
    which modules are called at depth 0 (the model, a loss module), until
    the first optimizer step, :data:`LEARN_CALLS` such calls or
    :data:`LEARN_STEPS` steps; then they go and each of those modules (at
    most :data:`MAX_ROOTS`) is timed by its class's ``__call__``: the class
    gets a ``__call__`` of its own that times its outermost instances' calls
    and passes every other call through, so that ``Module.__call__`` keeps
    torch's fast path (an empty hook pair adds ~4.5 µs to a call, measured
    here; a call passed through ~1.3 µs). A class
    attribute, so that a copy of the module (``copy.copy``, DataParallel's
    replicas, which copy its ``__dict__``), a deep copy and a pickle are
    untouched; undone at stop. Where the module's class also has instances
    inside it (a ``Sequential`` of ``Sequential``: each would pay the pass
    through) or it is a TorchScript module, a forward pre/post hook pair
    times it instead. The modules inside them run untouched. A module first
    called at depth 0 after the learning is not timed. Under ``torch.compile``
    or ``torch.export`` (Dynamo tracing) the class's ``__call__`` steps aside
    (``torch.compiler.is_dynamo_compiling()``, a constant to Dynamo), so it
    never breaks a graph."""

    def __init__(self, anatomy: Anatomy, m: Any, compiling: Callable[[], bool] | None) -> None:
        self.anatomy = anatomy
        self.clock = anatomy._clock
        self.compiling = compiling if callable(compiling) else _not_compiling
        self.learning = True
        self.roots: dict[int, Any] = {}
        #: Depth-0 modules past :data:`MAX_ROOTS` (ids), and those that refused a timer.
        self.over: set[int] = set()
        self.refused = 0
        self.calls = 0
        self.first_step: int | None = None
        self.settled_by: str | None = None
        #: The outermost modules timed by their class's ``__call__`` (the clock
        #: keeps which), and by hooks.
        self.by_call = 0
        self.by_hooks = 0
        #: The classes given a ``__call__``: what their ``__dict__`` had, and ours.
        self.classes: dict[type, list[Any]] = {}
        #: Watches for Dynamo's first import while a core ``__call__`` has no
        #: stand-in for Dynamo yet.
        self.watch: _DynamoWatch | None = None
        #: torch warns at each call of a ``torch.compile(module)`` while any
        #: global module hook exists; while only ours do (the learning), the
        #: warning is about them, and their extra call at the compiled
        #: wrapper is what the depth count is for: it is not shown then.
        self.quiet: tuple[Any, ...] | None = None
        has_global = getattr(m, "_has_any_global_hook", None)
        if callable(has_global) and not has_global():
            warnings.filterwarnings("ignore", message=_COMPILE_HOOKS_WARNING, category=UserWarning)
            self.quiet = warnings.filters[0]
        self.handles = [
            m.register_module_forward_pre_hook(self._learn_pre),
            _forward_hook(m.register_module_forward_hook, self._learn_post),
        ]
        self.script_module: type | None = getattr(getattr(sys.modules.get("torch"), "jit", None), "ScriptModule", None)
        #: The hooks learning which parameter is accumulated last (see
        #: :meth:`_hook_grads`); emptied once learnt or removed.
        self.grads_learning: list[Any] = []

    def _learn_pre(self, module: Any, _args: Any) -> None:
        # Dynamo reads is_dynamo_compiling() as True: a module compiled while
        # the modules are learnt traces no hook (no graph break).
        if self.compiling():
            return
        if self.clock.forward_depth == 0 and _get_ident() == self.anatomy.thread_id:
            key = id(module)
            if key not in self.roots:
                if len(self.roots) < MAX_ROOTS:
                    self.roots[key] = module
                elif len(self.over) < 1024:
                    self.over.add(key)
            self.calls += 1
        self.clock.forward_pre()

    def _learn_post(self, _module: Any, _args: Any, _out: Any) -> None:
        if self.compiling():
            return
        self.clock.forward_post()
        if self.clock.forward_depth == 0 and self.learning and _get_ident() == self.anatomy.thread_id:
            if self.calls >= LEARN_CALLS:
                self.settle(f"after {LEARN_CALLS} outermost module calls")
                return
            step_of = self.anatomy.step_of
            try:
                step = step_of() if step_of is not None else None
            except Exception:  # noqa: BLE001 - the loop cannot be read now: the calls bound it
                return
            if step is None:
                return
            if self.first_step is None:
                self.first_step = step
            elif step - self.first_step >= LEARN_STEPS:
                self.settle(f"after {LEARN_STEPS} steps without an optimizer step")

    def settle(self, by: str) -> None:
        """Stop learning: time the outermost modules seen so far only."""
        if not self.learning or self.clock.forward_depth:
            return
        self.learning = False
        self.settled_by = by
        for h in self.handles:
            h.remove()
        self.handles = []
        self._unquiet()
        for module in self.roots.values():
            try:
                self._time(module)
            except Exception:  # noqa: BLE001 - a module that refuses a timer is not timed
                self.refused += 1
        if _ranks() > 1:
            self._hook_grads(list(self.roots.values()))
        self.roots = {}

    def _hook_grads(self, modules: list[Any]) -> None:
        """Under several ranks, this rank's own gradients ready in backward:
        a post-accumulate-grad hook (the core's, no frame) on the parameter
        accumulated last in backward, before DDP's all-reduce holds the ranks
        together. The straggler analysis's arrival at backward
        (reports/stragglers.py). Which parameter is learnt in the first
        backward after the modules settle: each parameter's accumulation is
        noted (a Python hook, that backward only) and, at its end (the
        autograd engine's queued callback), the core's hook goes on the last
        (issue #36: the first registered parameter was taken as the last,
        and a model that registers its head first marked before most of
        backward, missing a slow part after it)."""
        try:
            params: dict[int, Any] = {}
            for module in modules:
                for p in module.parameters():
                    if p.requires_grad and hasattr(p, "register_post_accumulate_grad_hook"):
                        params.setdefault(id(p), p)
            if not params:
                return
            engine = sys.modules["torch"].autograd.Variable._execution_engine
            order: list[Any] = []
            learning = self.grads_learning
            grads_ready = self.clock.grads_ready

            def mark_last() -> None:
                # Runs inside the job's backward: never raises.
                try:
                    if not learning:
                        return  # removed at stop
                    for h in learning:
                        h.remove()
                    learning.clear()
                    self.handles.append(order[-1].register_post_accumulate_grad_hook(grads_ready))
                except Exception:  # noqa: BLE001 - no mark: backward's begin stands in
                    learning.clear()

            def accumulated(p: Any) -> None:
                if not learning:
                    return  # learnt already: this hook is being removed
                if not order:
                    try:
                        engine.queue_callback(mark_last)
                    except Exception:  # noqa: BLE001 - not learnt: no mark
                        return
                order.append(p)

            for p in params.values():
                learning.append(p.register_post_accumulate_grad_hook(accumulated))
            self.handles.extend(learning)
        except Exception:  # noqa: BLE001 - no mark: backward's begin stands in (the analysis)
            pass

    def _time(self, module: Any) -> None:
        cls = type(module)
        nested = any(isinstance(m, cls) for m in module.modules() if m is not module)
        if nested or (self.script_module is not None and isinstance(module, self.script_module)):
            self.handles.append(module.register_forward_pre_hook(_Hook(self.clock.forward_pre)))
            self.handles.append(_forward_hook(module.register_forward_hook, _Hook(self.clock.forward_post)))
            self.by_hooks += 1
            return
        if cls not in self.classes:
            before, call = cls.__dict__.get("__call__", _MISSING), cls.__call__
            ours = self._core_call(call)
            cls.__call__ = ours
            self.classes[cls] = [before, ours, call]
        self.clock.time_module(module)
        self.by_call += 1

    def summary(self) -> str:
        """How forward is timed, for the anatomy's status."""
        if self.learning:
            return "forward: still learning the outermost modules (global module hooks on every call)"
        n, hooks = self.by_call, self.by_hooks
        how = f"{n} by their class's __call__" + (f", {hooks} by hooks" if hooks else "")
        return f"forward: {n + hooks} outermost modules timed ({how}), settled {self.settled_by}"

    def untimed(self) -> str:
        """The outermost modules seen and not timed, for the anatomy's status."""
        return (
            f"{len(self.over) + self.refused} outermost modules "
            f"({len(self.over)} over the {MAX_ROOTS} timed, {self.refused} refusing a timer)"
        )

    def _core_call(self, call: Callable[..., Any]) -> Any:
        """The core's timed ``__call__`` around ``call`` (a C call: no frame,
        ~4k instructions less a call than a Python one), with a Python
        stand-in registered for Dynamo to trace in its place (it passes
        through: the phase is timed from outside a compiled call). Where
        Dynamo is not imported yet, it is registered when it is (the
        Python ``__call__`` takes the core's place then); where it cannot
        be, the Python ``__call__``."""
        method, function = self.clock.forward_call(call)
        if "torch._dynamo" not in sys.modules:
            if self.watch is None:
                self.watch = _DynamoWatch(self.for_dynamo)
                sys.meta_path.insert(0, self.watch)
            return method
        try:
            _stand_in_for_dynamo(function, call)
        except Exception:  # noqa: BLE001 - an older Dynamo: the Python __call__, which it traces
            return _timed_call(self, call)
        return method

    def for_dynamo(self) -> None:
        """Dynamo is being imported (it is not run yet, so no stand-in can be
        registered): each class's core ``__call__`` becomes the Python one,
        which steps aside while Dynamo traces."""
        self._unwatch()
        for cls, entry in self.classes.items():
            _before, ours, call = entry
            if cls.__dict__.get("__call__") is ours:
                entry[1] = cls.__call__ = _timed_call(self, call)  # type: ignore[method-assign]

    def _unwatch(self) -> None:
        if self.watch is not None:
            try:
                sys.meta_path.remove(self.watch)
            except ValueError:
                pass
            self.watch = None

    def _unquiet(self) -> None:
        """The learning's global hooks are gone: torch's warning shows again."""
        if self.quiet is not None:
            try:
                filters: list[Any] = warnings.filters  # type: ignore[assignment]  # a list at run time
                filters.remove(self.quiet)
                # A change through the API, so that warnings re-reads its filters.
                warnings.filterwarnings("default", message="", append=True)
                filters.pop()
            except ValueError:
                pass
            self.quiet = None

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
        self.grads_learning.clear()
        self._unquiet()
        self._unwatch()
        # Every call passes through from now on (a wrapper put around ours keeps
        # it): the clock is stopped with the anatomy.
        for cls, (before, ours, _call) in self.classes.items():
            if cls.__dict__.get("__call__") is ours:
                if before is _MISSING:
                    del cls.__call__
                else:
                    cls.__call__ = before  # type: ignore[method-assign]
        self.classes = {}
        self.roots = {}


#: The core's ``__call__`` functions given a stand-in for Dynamo, kept for
#: the process's life: Dynamo keys its stand-ins by ``id()``, which a freed
#: function's successor could take.
_STOOD_IN: list[Any] = []


#: The start of torch's warning at a ``torch.compile(module)`` call while a
#: global module hook exists (``torch/_dynamo/eval_frame.py``).
_COMPILE_HOOKS_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks on modules"


def _stand_in_for_dynamo(function: Any, call: Callable[..., Any]) -> None:
    """Register with Dynamo a Python function to trace in place of the core's
    ``function`` (a builtin): the plain ``call``, untimed while compiling."""

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        return call(self, *args, **kwargs)

    sys.modules["torch._dynamo"].substitute_in_graph(function, skip_signature_check=True)(__call__)
    _STOOD_IN.append(function)


class _DynamoWatch:
    """A finder on ``sys.meta_path`` that finds nothing: it calls ``then()``
    when ``torch._dynamo`` is first imported (before it runs)."""

    def __init__(self, then: Callable[[], None]) -> None:
        self.then = then

    def find_spec(self, name: str, _path: Any = None, _target: Any = None) -> None:
        if name == "torch._dynamo":
            try:
                self.then()
            except Exception:  # noqa: BLE001 - the import goes on
                pass


def _timed_call(timer: _Forward, call: Callable[..., Any]) -> Callable[..., Any]:
    """The ``__call__`` of a class with outermost modules: times theirs
    (``phase.forward``, by the core's clock), passes every other call
    through to ``call``."""
    compiling = timer.compiling
    enter = timer.clock.enter_forward
    leave = timer.clock.forward_post

    @functools.wraps(call)
    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        # Dynamo reads is_dynamo_compiling() as True: it traces the call alone.
        if compiling() or not enter(self):
            return call(self, *args, **kwargs)
        try:
            return call(self, *args, **kwargs)
        finally:
            leave()

    return __call__


def _group_at(fn: Callable[..., Any]) -> int | None:
    """The position of a collective's ``group`` parameter (``all_reduce(tensor,
    op, group)``: 2), looked up once when it is wrapped; None when it has none."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    for i, p in enumerate(params):
        if p.name == "group" and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            return i
    return None


def _forward_hook(register: Callable[..., Any], hook: Callable[..., Any]) -> Any:
    """``register(hook, always_call=True)`` (torch >= 2.0), else without it."""
    try:
        return register(hook, always_call=True)
    except TypeError:
        return register(hook)


#: ``FASTPROF_ANATOMY_GPU=0``: the anatomy records host phases only (no CUDA events).
GPU_ENV = "FASTPROF_ANATOMY_GPU"
#: A step is timed only when this many timed steps' cost has passed since the
#: previous timed step (1% of the training thread).
GPU_BUDGET_FACTOR = 100
#: Timed steps whose events have not completed yet, kept at most (older ones
#: are dropped and counted: a GPU this far behind is timed later).
GPU_PENDING = 8
#: Marks (phase begins and ends) timed per step at most (a step that calls
#: its model thousands of times is timed in its first ones only).
GPU_MARKS = 64


class _GpuPhases:
    """Each phase's time on the GPU, from CUDA events recorded on the current
    stream at the phase's begin and end on the host (see the module's doc).

    A phase's GPU time is the stream's time between the two events: the
    phase's kernels and any gap in which the stream waited for the host to
    launch them. Work the phase puts on other streams is not in it. Never
    raises: a failure turns GPU timing off with the reason."""

    def __init__(self, torch: Any, anatomy: Anatomy) -> None:
        self.cuda = torch.cuda
        self.anatomy = anatomy
        self.name = _core.name_id(GPU_COUNTER)
        self.step_name = _core.name_id(GPU_STEP_COUNTER)
        self.step: int | None = None
        self.timed = False
        self.marks: list[tuple[str, bool, Any]] = []
        self.pending: deque[tuple[int, list[tuple[str, bool, Any]]]] = deque()
        self.free: list[Any] = []
        self.cost_ns = 0.0
        self.gap_ns = 0.0
        self.last_ns = 0
        self.step_cost_ns = 0
        self.timed_steps = 0
        self.recorded = 0
        self.dropped = 0
        #: Timed steps with more than GPU_MARKS phase marks (the rest untimed on the GPU).
        self.capped = 0
        self.step_capped = False
        #: Timed steps lost to the failure that stopped GPU timing.
        self.lost = 0
        self.failed: str | None = None

    def mark(self, phase: str, end: bool) -> None:
        """A phase begins or ends on the training thread."""
        try:
            step_of = self.anatomy.step_of
            if step_of is None or self.failed:
                return
            step = step_of()
            if step != self.step:
                self._new_step(step)
            if not self.timed:
                return
            if len(self.marks) >= GPU_MARKS:
                self.step_capped = True
                return
            t0 = time.perf_counter_ns()
            ev = self.free.pop() if self.free else self.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append((phase, end, ev))
            self.step_cost_ns += time.perf_counter_ns() - t0
        except Exception as e:  # noqa: BLE001 - timing never fails the step
            self._fail(e)

    def _new_step(self, step: int) -> None:
        now = time.perf_counter_ns()
        if self.timed and self.marks:
            self.pending.append((int(self.step or 0), self.marks))
            self.cost_ns = moving_cost(self.cost_ns, float(self.step_cost_ns), self.timed_steps)
            self.gap_ns = GPU_BUDGET_FACTOR * self.cost_ns
            self.timed_steps += 1
            if len(self.pending) > GPU_PENDING:
                _, marks = self.pending.popleft()
                self.dropped += 1
                self.free.extend(ev for _, _, ev in marks)
        self.capped += self.step_capped
        self.step_capped = False
        self.marks = []
        self.step_cost_ns = 0
        self.step = step
        self.timed = False
        self._resolve()
        # From one timed step's start to the next, at least 100 times what timing one costs.
        self.timed = now - self.last_ns >= self.gap_ns and self.cuda.is_initialized()
        if self.timed:
            self.last_ns = now

    def _resolve(self) -> None:
        """Record the timed steps whose events have all completed (oldest first; never waits)."""
        while self.pending:
            step, marks = self.pending[0]
            if not all(ev.query() for _, _, ev in marks):
                return
            ms: dict[str, float] = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0, "communication": 0.0}
            begun: dict[str, Any] = {}
            for phase, end, ev in marks:
                if not end:
                    begun[phase] = ev
                elif phase in begun:
                    ms[phase] = ms.get(phase, 0.0) + begun.pop(phase).elapsed_time(ev)
            ms["span"] = marks[0][2].elapsed_time(marks[-1][2]) if len(marks) > 1 else 0.0
            self.pending.popleft()
            # The step's number is a counter of its own, just before the times:
            # a series of a counter in ms would plot it as milliseconds.
            _core.counter(self.step_name, float(step))
            _core.counter(self.name, ms)
            self.recorded += 1
            self.free.extend(ev for _, _, ev in marks)

    def flush(self, wait_s: float = 0.5) -> None:
        """At stop: the last timed step joins the pending ones; those that
        complete within ``wait_s`` (polled, so a hung GPU never holds the
        stop) are recorded, the rest counted as dropped."""
        try:
            if self.step is not None:
                self._new_step(-1)
            deadline = time.monotonic() + wait_s
            self._resolve()
            while self.pending and time.monotonic() < deadline:
                time.sleep(0.001)
                self._resolve()
            self.dropped += len(self.pending)
            self.pending.clear()
        except Exception as e:  # noqa: BLE001 - best effort at stop
            self._fail(e)

    def _fail(self, e: BaseException) -> None:
        if self.failed is None:
            self.failed = f"{type(e).__name__}: {e}"
        # The timed steps not recorded yet are lost with it, and counted.
        self.lost += len(self.pending) + (1 if self.timed else 0)
        self.pending.clear()
        self.marks = []
        self.timed = False

    def summary(self) -> str:
        """What GPU timing recorded, for profiler.json's anatomy status."""
        if self.failed:
            return f"stopped: {self.failed}; {self.recorded} timed steps recorded before it, {self.lost} lost"
        if not self.timed_steps:
            return "CUDA events, within a 1% budget: no step used CUDA"
        capped = f", {self.capped} timed in their first {GPU_MARKS} phase marks only" if self.capped else ""
        return (
            f"CUDA events, within a 1% budget: {self.recorded} steps recorded, {self.dropped} not completed in time"
            f"{capped}, {self.cost_ns / 1e3:.1f} us per timed step"
        )
