"""The ``fastprof`` command line: one module per verb."""
