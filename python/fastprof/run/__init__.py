"""``fastprof run``'s machinery inside the process: a script (or ``-m``
module) run as ``python script.py`` would run it, under a
:class:`fastprof.Profiler`, with no change to the script. The verb itself
(its options, its exit) is :mod:`fastprof.cli.run`.

* :mod:`.target`: what to run, found and compiled before anything starts;
* :mod:`.script`: running it as ``__main__``, and ending as Python does;
* :mod:`.zero_code`: the steps and DataLoader passes the script never
  names, inferred (its patches made and undone in one place);
* :mod:`.after_import`: the hook that waits for the script's ``import torch``.
"""

from fastprof.run.script import Ended, print_exception, run
from fastprof.run.target import CompileFailed, Target, TargetError, module_target, script_target
from fastprof.run.zero_code import ZeroCode

__all__ = [
    "CompileFailed",
    "Ended",
    "Target",
    "TargetError",
    "ZeroCode",
    "module_target",
    "print_exception",
    "run",
    "script_target",
]
