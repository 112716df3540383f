"""Where the tests find this checkout and the commands installed beside the interpreter that runs them."""
from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
