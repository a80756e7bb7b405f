"""Loads a file of scripts/ as a module, for the CPU tests of its pure parts."""

from __future__ import annotations

import importlib.util
import sys
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Iterator

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@contextmanager
def script_module(file_name: str) -> Iterator[ModuleType]:
    """``scripts/<file_name>`` imported under a name of its own while the block runs."""
    spec = importlib.util.spec_from_file_location(f"{Path(file_name).stem}_under_test", SCRIPTS / file_name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)
