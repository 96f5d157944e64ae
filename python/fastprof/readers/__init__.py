"""The readers of traces and runs, each a thin front over the core's
streaming scanner: :func:`~fastprof.readers.trace.read_trace` (also
``fastprof.read_trace``), :func:`~fastprof.readers.columns.read_columns`
(``fastprof.read_columns``: numpy columns) and
:func:`~fastprof.readers.merge.merge` (``fastprof.merge``: one timeline of
many traces and ranks). Nothing is imported here, so that importing one of
them imports no other.
"""
