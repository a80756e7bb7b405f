"""Array-library plumbing of the general GEMM: uploads, allocations, devices, streams.

CuPy is the default library (imported only when needed); PyTorch tensors are
served in kind. bfloat16 needs care because not every library can hold it:
CuPy >= 14 can (with ml_dtypes installed), older CuPy cannot, so uploads and
allocations fall back to ``uint16`` storage behind a
:class:`~ferrum_ffi._interop.Bfloat16Array` view.
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable, Sequence

import numpy as np

from ._interop import Bfloat16Array, DeviceArray, producer_streams_to_wait, resolve_stream
from ._native import library
from .status import ArgumentError, ArgumentTypeError

ToDevice = Callable[[np.ndarray], Any]


def is_bfloat16(dtype: np.dtype) -> bool:
    return dtype.name == "bfloat16" and dtype.itemsize == 2


def bfloat16_dtype() -> np.dtype:
    try:
        import ml_dtypes
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise ArgumentError("bfloat16 needs the ml_dtypes package (pip install ml_dtypes)") from exc
    return np.dtype(ml_dtypes.bfloat16)


def cupy_module():
    try:
        import cupy
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise ArgumentError(
            "uploading or allocating needs CuPy (pip install 'ferrum_ffi[cupy]'), "
            "or pass to_device= / out= from your array library"
        ) from exc
    return cupy


def upload(host: np.ndarray, to_device: ToDevice | None = None) -> Any:
    """Host array -> device array: ``to_device(host)`` when given, else CuPy.
    A bfloat16 array CuPy cannot hold goes up as uint16 behind a bfloat16 view."""
    if to_device is not None:
        return to_device(host)
    cupy = cupy_module()
    if is_bfloat16(host.dtype):
        try:
            return cupy.asarray(host)
        except (TypeError, ValueError, NotImplementedError):
            return Bfloat16Array(cupy.asarray(host.view(np.uint16)))
    return cupy.asarray(host)


def device_of(obj: Any, view: DeviceArray) -> int:
    """The device an array lives on, cheaply when its library says so."""
    base = obj.base if isinstance(obj, Bfloat16Array) else obj
    device = getattr(base, "device", None)
    if view.library == "cupy" and device is not None and hasattr(device, "id"):
        return int(device.id)
    if view.library == "torch" and device is not None and getattr(device, "index", None) is not None:
        return int(device.index)
    if not view.ptr:
        return 0
    lib = library()
    dev = ctypes.c_int(-1)
    lib.check("ferrum_marlin_pointer_device", lib.ferrum_marlin_pointer_device(view.ptr, ctypes.byref(dev)))
    return dev.value


def _library_of(like: Any, view: DeviceArray | None) -> str:
    if view is not None:
        return view.library
    return "torch" if type(like).__module__.split(".")[0] == "torch" else "cupy"


def allocate(
    like: Any,
    view: DeviceArray | None,
    shape: tuple[int, ...],
    dtype: np.dtype,
    device: int,
    stream: int | None = None,
) -> Any:
    """An uninitialised device array in the library of ``like`` (CuPy unless
    ``like`` is a torch tensor); bfloat16 as a view over uint16 when ``like``
    is such a view, or when CuPy cannot hold bfloat16.

    ``stream``: allocate on that stream (CuPy and PyTorch caching allocators
    hand a freed block only to later allocations on the stream it was
    allocated on, which keeps a cached scratch buffer that is replaced while a
    kernel on ``stream`` still uses it from being reused by other streams)."""
    dtype = np.dtype(dtype)
    if isinstance(like, Bfloat16Array):
        # The view's library holds bfloat16 as uint16 bits; other dtypes as they are.
        if not is_bfloat16(dtype):
            return allocate(like.base, None, shape, dtype, device, stream)
        return Bfloat16Array(allocate(like.base, None, shape, np.dtype(np.uint16), device, stream))
    if _library_of(like, view) == "torch":
        import contextlib

        import torch

        torch_dtype = {
            "float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
            "int32": torch.int32, "uint16": torch.int16,  # int16 storage: torch has no general uint16
        }[dtype.name]
        on_stream = (
            torch.cuda.stream(torch.cuda.ExternalStream(stream, device=f"cuda:{device}"))
            if stream not in (None, 0, 1)
            else contextlib.nullcontext()
        )
        with torch.cuda.device(device), on_stream:
            return torch.empty(shape, dtype=torch_dtype, device=f"cuda:{device}")
    cupy = cupy_module()
    with cupy.cuda.Device(device), _cupy_stream(cupy, stream, device):
        if is_bfloat16(dtype):
            try:
                return cupy.empty(shape, dtype=dtype)
            except (TypeError, ValueError, NotImplementedError):
                return Bfloat16Array(cupy.empty(shape, dtype=np.uint16))
        return cupy.empty(shape, dtype=dtype)


class _RawStream:
    """A raw ``cudaStream_t`` handle in the CUDA stream protocol."""

    def __init__(self, handle: int) -> None:
        self._handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self._handle)


def _cupy_stream(cupy, stream: int | None, device: int):
    import contextlib

    if stream is None:
        return contextlib.nullcontext()
    if stream in (0, 1):
        return cupy.cuda.Stream.null
    # CuPy 14 deprecates ExternalStream for Stream.from_external (the stream protocol).
    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None:
        return from_external(_RawStream(stream))
    return cupy.cuda.ExternalStream(stream, device)


def prepare_stream(stream: Any, views: Sequence[DeviceArray]) -> int:
    """The launch stream handle, made to wait (on the device, no host sync) for
    the producer streams the arrays' CUDA Array Interface names."""
    handle = resolve_stream(stream, views)
    producers = producer_streams_to_wait(views, handle)
    if producers:
        lib = library()
        for producer in producers:
            lib.check("ferrum_marlin_stream_wait", lib.ferrum_marlin_stream_wait(handle, producer))
    return handle


def host_array(array: Any, name: str) -> np.ndarray:
    """A NumPy view of a host array, or a host copy of a CuPy/torch one."""
    if isinstance(array, np.ndarray):
        return array
    module = type(array).__module__.split(".")[0]
    if module == "cupy":
        return array.get()
    if module == "torch":
        return _torch_to_host(array)
    raise ArgumentTypeError(f"{name}: expected a numpy.ndarray (or a CuPy/torch array), got {type(array).__name__}")


def _torch_to_host(tensor: Any) -> np.ndarray:
    """NumPy cannot take torch's bfloat16 / float8 tensors: go through their bits."""
    import torch

    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(bfloat16_dtype())
    if tensor.dtype == getattr(torch, "float8_e4m3fn", None):
        return tensor.view(torch.uint8).numpy()
    return tensor.numpy()
