"""Reports of a run read from files (see the modules)."""
