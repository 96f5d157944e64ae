"""The recording front: :class:`~fastprof.recording.recorder.Recorder` (a
session handle, also ``fastprof.Recorder``), the one options table
(:mod:`.options`, rendered for README by :mod:`.options_doc`), the run
directory (:mod:`.rundir`), the host sampler fallback
(:mod:`.psutil_sampler`), the GPU inventory (:mod:`.gpu`) and the moving
cost behind per-step budgets (:mod:`.budget`) and the span decorator
(:mod:`.decorate`, which the core imports by that name). Nothing is
imported here, so that importing one of them imports no other.
"""
