"""report.json: the report document, written to a temporary name and renamed;
non-finite numbers spelt as the trace spells them."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from fastprof.reports.finite import encode


def write_json(doc: dict[str, Any], out_dir: Path) -> Path:
    path = out_dir / "report.json"
    tmp = out_dir / f".report.json.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(encode(doc), indent=1, allow_nan=False))
    os.replace(tmp, path)
    return path
