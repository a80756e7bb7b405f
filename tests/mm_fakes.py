"""Stand-ins for the CPU tests of the general GEMM: device arrays that are only
a ``__cuda_array_interface__``, host-backed ones whose bytes tests can read,
and a library that records the launch struct instead of running it."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import numpy as np

from ferrum_ffi import _devices, _scratch, general_gemm, mm, weights
from ferrum_ffi._native import FerrumMarlinLaunch, NativeLibrary


class FakeCAI:
    """A device array that is nothing but a ``__cuda_array_interface__`` dict
    (distinct, 16-byte aligned fake pointers unless one is given)."""

    _next_ptr = 0x7000_0000

    def __init__(self, shape, typestr="<f2", ptr=None, readonly=False, strides=None, dtype=None):
        if ptr is None:
            ptr = FakeCAI._next_ptr
            FakeCAI._next_ptr += 1 << 26
        self.__cuda_array_interface__ = {
            "version": 3,
            "shape": tuple(shape),
            "typestr": typestr,
            "data": (ptr, readonly),
            "strides": strides,
        }
        if dtype is not None:
            self.dtype = dtype  # how a CuPy >= 14 bfloat16 array declares itself


def bf16_cai(shape, **kwargs):
    """A CuPy-14-style bfloat16 array: CAI '<V2' plus a bfloat16 ``dtype``."""
    import ml_dtypes

    return FakeCAI(shape, "<V2", dtype=np.dtype(ml_dtypes.bfloat16), **kwargs)


class HostCAI:
    """A host NumPy array dressed as a device array (16-byte aligned copy), so
    that weight objects can be built and their buffers read back on the CPU."""

    def __init__(self, host: np.ndarray):
        host = np.ascontiguousarray(host)
        raw = np.empty(host.nbytes + 16, dtype=np.uint8)
        offset = (-raw.ctypes.data) % 16
        self.array = raw[offset : offset + host.nbytes].view(host.dtype).reshape(host.shape)
        self.array[...] = host
        self.dtype = host.dtype
        typestr = "<V2" if host.dtype.name == "bfloat16" else host.dtype.str
        self.__cuda_array_interface__ = {
            "version": 3,
            "shape": host.shape,
            "typestr": typestr,
            "data": (self.array.ctypes.data, False),
            "strides": None,
        }


def host_cai(host: np.ndarray) -> HostCAI:
    return HostCAI(host)


def launch_fields(launch: FerrumMarlinLaunch) -> dict:
    fields = {}
    for name, _ in FerrumMarlinLaunch._fields_:
        value = getattr(launch, name)
        if name in ("g_idx", "perm"):
            value = ctypes.cast(value, ctypes.c_void_p).value or 0
        elif value is None:
            value = 0
        fields[name] = value
    return fields


class FakeLibrary:
    """Records ``ferrum_marlin_mm`` launches and memsets; answers ``status``."""

    check = NativeLibrary.check

    def __init__(self, status: int = 0, sms: int = 132, detail: str = "fake native detail"):
        self.status = status
        self.sms = sms
        self.detail = detail
        self.launches: list[dict] = []
        self.memsets: list[tuple[int, int, int, int]] = []
        self.device_queries = 0
        self.cdll = SimpleNamespace(ferrum_marlin_cuda_error_name=lambda code: b"cudaErrorInvalidValue")

    def ferrum_marlin_mm(self, launch_ref) -> int:
        self.launches.append(launch_fields(launch_ref._obj))
        return self.status

    def ferrum_marlin_device_info(self, dev, name, length, major, minor, sms, total) -> int:
        self.device_queries += 1
        sms._obj.value = self.sms
        return 0

    def ferrum_marlin_memset_async(self, ptr, value, nbytes, stream) -> int:
        self.memsets.append((int(ptr), int(value), int(nbytes), int(stream or 0)))
        return 0

    def ferrum_marlin_stream_wait(self, consumer, producer) -> int:
        return 0

    def last_error(self) -> str:
        return self.detail if self.status else ""


def install_library(monkeypatch, lib: FakeLibrary | None = None) -> FakeLibrary:
    """Route the raw-pointer launcher to ``lib`` (a fresh sm-count cache)."""
    lib = lib or FakeLibrary()
    monkeypatch.setattr(mm, "library", lambda: lib)
    monkeypatch.setattr(mm, "_device_facts", {})
    return lib


def install(monkeypatch, lib: FakeLibrary | None = None) -> FakeLibrary:
    """Route every module of the general GEMM to ``lib`` and to fake
    allocations (FakeCAI) on device 0."""
    lib = install_library(monkeypatch, lib)
    for module in (general_gemm, _scratch, _devices):
        monkeypatch.setattr(module, "library", lambda: lib)
    monkeypatch.setattr(_scratch, "_cache", {})
    allocations = []

    def fake_allocate(like, view, shape, dtype, device, stream=None):
        dtype = np.dtype(dtype)
        array = FakeCAI(shape, "<V2" if dtype.name == "bfloat16" else dtype.str,
                        dtype=dtype if dtype.name == "bfloat16" else None)
        allocations.append((shape, dtype, stream))
        return array

    monkeypatch.setattr(_scratch, "allocate", fake_allocate)
    monkeypatch.setattr(general_gemm, "allocate", fake_allocate)
    monkeypatch.setattr(general_gemm, "device_of", lambda obj, view: 0)
    monkeypatch.setattr(weights, "device_of", lambda obj, view: 0)
    lib.allocations = allocations
    return lib
