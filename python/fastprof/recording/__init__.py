"""The recording front: :class:`~fastprof.recording.recorder.Recorder` (a
session handle, also ``fastprof.Recorder``), the one options table
(:mod:`.options`, rendered for README by :mod:`.options_doc`), the run
directory (:mod:`.rundir`), the host sampler fallback
(:mod:`.psutil_sampler`), the GPU inventory (:mod:`.gpu`) and the moving
cost behind per-step budgets (:mod:`.budget`). The span decorator stays
``fastprof._decorate``: the core imports it by that name. Nothing is
imported here, so that importing one of them imports no other.
"""
