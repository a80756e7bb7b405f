"""Shared fixtures: GPU tests carry the ``gpu`` marker and skip cleanly without a device."""

from __future__ import annotations

import pytest


def _gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU and CuPy")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def cp():
    import cupy

    return cupy
