"""report.json: the report document, written to a temporary name and renamed."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json(doc: dict[str, Any], out_dir: Path) -> Path:
    path = out_dir / "report.json"
    tmp = out_dir / f".report.json.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(doc, indent=1, allow_nan=False))
    os.replace(tmp, path)
    return path
