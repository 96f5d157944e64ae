"""report.json: the report document, written to a temporary name and renamed;
non-finite numbers spelt as the trace spells them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastprof.recording.names import REPORT_JSON
from fastprof.reports.finite import encode


def write_json(doc: dict[str, Any], out_dir: Path) -> Path:
    """``out_dir/report.json``. ``out_dir`` is the report's staging folder
    (``reports.report._write`` moves it in whole), so no temporary file."""
    path = out_dir / REPORT_JSON
    path.write_text(json.dumps(encode(doc), indent=1, allow_nan=False))
    return path
