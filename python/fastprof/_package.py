"""The distribution fastprof is installed as, for every line that tells a
user what to install.

The import name and the command are ``fastprof``, but ``fastprof`` on the
Python package index is an unrelated project (likelihood-based statistics)
with a top-level ``fastprof`` package of its own: ``pip install
'fastprof[s3]'`` installs that one, and over ours when both share a
site-packages. Ours is :data:`DISTRIBUTION` (pyproject.toml's
``[project] name``; a test holds the two equal).
"""

from __future__ import annotations

#: The name pip, uv and importlib.metadata know this project by.
DISTRIBUTION = "fastprof-torch"


def pip_install(extra: str | None = None) -> str:
    """The command that installs fastprof, or adds ``extra`` to an installed
    one (pip then installs only the extra's packages: nothing is built)."""
    return f"pip install '{DISTRIBUTION}[{extra}]'" if extra else f"pip install {DISTRIBUTION}"
