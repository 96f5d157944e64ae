"""The Profiler's drivers, one per feature (the protocol:
:mod:`fastprof.profiler.driver`). :func:`fastprof.profiler.drivers.build.build` makes them in the order
the Profiler calls them; adding a feature is a driver here and a line there.

====================  =========================================================
driver                what it does
====================  =========================================================
``exits``             the interpreter's exit and SIGTERM close the Profiler
``gate``              ``gate_spans``: the recorder paused outside windows
``windows``           torch.profiler windows over the steps the plan records
``clocks``            the clock syncs across ranks (start, end)
``optimizer``         steps inferred from ``optimizer.step()``
``anatomy``           where each step's time goes (forward, backward, ...)
``memory``            allocator statistics and history, OOM capture, model summary
``workers``           DataLoader workers' fetches, recorded in the workers
``triggers``          captures and flight dumps asked for while the job runs
``outputs``           ``profiler.json``, the merge and the upload at the end
====================  =========================================================
"""
