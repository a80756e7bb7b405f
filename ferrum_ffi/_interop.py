"""Framework-free reading of CUDA device arrays and CUDA streams.

This module turns whatever the caller hands us -- a CuPy array, anything that
exposes ``__cuda_array_interface__`` (PyTorch, Numba, JAX, ...), or any DLPack
producer -- into a small immutable :class:`DeviceArray` record, and turns any
CUDA stream object into an integer ``cudaStream_t`` handle.

No array framework is imported at module import time.  CuPy / PyTorch are only
imported lazily, and only when an object has been detected (by
``type(obj).__module__``) to come from them, e.g. to ask for their *current*
stream in :func:`resolve_stream`.

Protocols implemented
---------------------
* CUDA Array Interface (CAI) versions 2 and 3
  (https://numba.readthedocs.io/en/stable/cuda/cuda_array_interface.html).
* DLPack Python protocol (``__dlpack__`` / ``__dlpack_device__``), with the
  capsule parsed through :mod:`ctypes` (``DLManagedTensor`` and, when a
  producer hands one back, ``DLManagedTensorVersioned``).
* The CUDA stream protocol (``__cuda_stream__`` returning ``(version, handle)``)
  plus the native stream objects of CuPy, PyTorch and Numba.
"""

from __future__ import annotations

import ctypes
import math
import numbers
import operator
import weakref
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ferrum_ffi.status import ArgumentError, ArgumentTypeError

__all__ = [
    "Bfloat16Array",
    "DeviceArray",
    "as_device_array",
    "bfloat16_view",
    "resolve_stream",
    "producer_streams_to_wait",
]


# --------------------------------------------------------------------------
# The record
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceArray:
    """A borrowed view of a device array.

    ``owner`` keeps the producer (and, for DLPack, the consumed capsule's
    ``DLManagedTensor``) alive; hold on to the record (or its ``owner``) for as
    long as ``ptr`` is in use, including until any kernel reading it finished.
    """

    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype
    strides: tuple[int, ...] | None
    stream: int | None
    readonly: bool
    library: str
    owner: object = field(compare=False, repr=False)

    @classmethod
    def _record(cls, ptr: int, shape: tuple[int, ...], dtype: np.dtype, strides: tuple[int, ...] | None,
                stream: int | None, readonly: bool, library: str, owner: object) -> "DeviceArray":
        """The record of fields already checked, built without the frozen
        ``__init__``'s per-field ``object.__setattr__`` (a third of a small
        call's parse): for the interface's plain fast path."""
        record = object.__new__(cls)
        record.__dict__.update(ptr=ptr, shape=shape, dtype=dtype, strides=strides, stream=stream, readonly=readonly,
                               library=library, owner=owner)
        return record

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def is_c_contiguous(self) -> bool:
        """True when ``strides`` is None or describes a C-ordered layout.

        Strides of dimensions of extent 1 are irrelevant, and an array of
        size 0 is always contiguous (NumPy's convention).
        """
        if self.strides is None:
            return True
        if len(self.strides) != len(self.shape):
            return False
        if self.size == 0:
            return True
        expected = self.itemsize
        for extent, stride in zip(reversed(self.shape), reversed(self.strides)):
            if extent != 1 and stride != expected:
                return False
            expected *= extent
        return True


# --------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------

_LIBRARY_BY_TOP_MODULE = {
    "cupy": "cupy",
    "cupyx": "cupy",
    "cupy_backends": "cupy",
    "torch": "torch",
    "jax": "jax",
    "jaxlib": "jax",
    "numba": "numba",
    "numba_cuda": "numba",
}


def _type_name(obj: object) -> str:
    tp = type(obj)
    module = getattr(tp, "__module__", None) or ""
    qualname = getattr(tp, "__qualname__", tp.__name__)
    if module in ("", "builtins"):
        return qualname
    return f"{module}.{qualname}"


def _top_module(obj: object) -> str:
    module = getattr(type(obj), "__module__", None) or ""
    return module.split(".", 1)[0]


_library_by_type: dict[tuple[type, str], str] = {}


def _detect_library(obj: object, fallback: str) -> str:
    if isinstance(obj, Bfloat16Array):
        obj = obj.base  # the view's storage decides streams and allocations
    key = (type(obj), fallback)
    library = _library_by_type.get(key)
    if library is None:
        library = _library_by_type[key] = _LIBRARY_BY_TOP_MODULE.get(_top_module(obj), fallback)
    return library


def _as_int(value: object) -> int | None:
    """``int(value)`` for integers (Python or NumPy), None for anything else.

    ``bool`` is rejected on purpose: ``True`` is not a pointer or an extent.
    """
    if type(value) is int:
        return value
    if isinstance(value, (bool, np.bool_)):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


# --------------------------------------------------------------------------
# CUDA Array Interface
# --------------------------------------------------------------------------

_MISSING = object()


# typestr -> dtype for the typestrs that passed every check below (parsing
# one costs more than the rest of a small array's checks).
_checked_dtypes: dict[str, np.dtype] = {}


def _cai_is_opaque(cai: object) -> bool:
    """True when the CAI describes an opaque void element type (e.g. '<V2')."""
    if not isinstance(cai, dict) or not isinstance(cai.get("typestr"), str):
        return False
    dtype = _checked_dtypes.get(cai["typestr"])
    if dtype is not None:
        return dtype.kind == "V"
    try:
        return np.dtype(cai["typestr"]).kind == "V"
    except (TypeError, ValueError):
        return False


def _plain_cai_array(obj: object, cai: object) -> DeviceArray | None:
    """The record of the plain interface that CuPy, Numba and PyTorch export
    (a dict of exact ints, tuples and bools; a typestr that passed the checks
    of :func:`_from_cai` before and is not opaque), read without the general
    parse, which cost more than the rest of a small call's checks; None for
    anything else, which :func:`_from_cai` then checks (and rejects where it
    is wrong). Accepts nothing that :func:`_from_cai` would reject, and
    describes what it accepts the same way."""
    if type(cai) is not dict:
        return None
    typestr = cai.get("typestr")
    if type(typestr) is not str:
        return None
    dtype = _checked_dtypes.get(typestr)
    version = cai.get("version")
    shape = cai.get("shape")
    data = cai.get("data")
    if (dtype is None or dtype.kind == "V" or type(version) is not int or version < 2 or type(shape) is not tuple
            or type(data) is not tuple or len(data) != 2 or cai.get("mask") is not None):
        return None
    for extent in shape:
        if type(extent) is not int or extent < 0:
            return None
    ptr, readonly = data
    if type(ptr) is not int or ptr <= 0 or type(readonly) is not bool:
        return None
    strides = cai.get("strides")
    if strides is not None:
        if type(strides) is not tuple or len(strides) != len(shape):
            return None
        for stride in strides:
            if type(stride) is not int:
                return None
    stream = cai.get("stream")
    if stream is not None and (type(stream) is not int or stream <= 0):
        return None
    return DeviceArray._record(ptr, shape, dtype, strides, stream, readonly, _detect_library(obj, "cai"), obj)


def _from_cai(obj: object, cai: object, name: str, declared: np.dtype | None = None) -> DeviceArray:
    """``declared``: the element type the object itself reports for an opaque
    2-byte CAI typestr (bfloat16, which the CAI cannot spell)."""
    if not isinstance(cai, dict):
        raise ArgumentTypeError(
            f"{name}: __cuda_array_interface__ must be a dict, got {_type_name(cai)}"
        )

    version = cai.get("version", _MISSING)
    if version is _MISSING:
        raise ArgumentError(
            f"{name}: __cuda_array_interface__ has no 'version'; versions 2 and 3 are supported"
        )
    version_int = _as_int(version)
    if version_int is None or version_int < 2:
        raise ArgumentError(
            f"{name}: __cuda_array_interface__ version {version!r} is not supported "
            f"(version >= 2 required)"
        )

    # shape
    shape_raw = cai.get("shape", _MISSING)
    if shape_raw is _MISSING or not isinstance(shape_raw, (tuple, list)):
        raise ArgumentError(
            f"{name}: __cuda_array_interface__ 'shape' must be a tuple of ints, got {shape_raw!r}"
        )
    shape_list = []
    for extent in shape_raw:
        extent_int = _as_int(extent)
        if extent_int is None or extent_int < 0:
            raise ArgumentError(
                f"{name}: __cuda_array_interface__ 'shape' must contain non-negative ints, "
                f"got {tuple(shape_raw)!r}"
            )
        shape_list.append(extent_int)
    shape = tuple(shape_list)
    size = math.prod(shape)

    # typestr (descr is ignored: it only refines structured types)
    typestr = cai.get("typestr", _MISSING)
    if not isinstance(typestr, str):
        raise ArgumentError(
            f"{name}: __cuda_array_interface__ 'typestr' must be a str, got {typestr!r}"
        )
    dtype = _checked_dtypes.get(typestr)
    if dtype is None:
        try:
            dtype = np.dtype(typestr)
        except (TypeError, ValueError) as exc:
            raise ArgumentError(
                f"{name}: __cuda_array_interface__ 'typestr' {typestr!r} is not a known dtype"
            ) from exc
        if dtype.hasobject:
            raise ArgumentError(
                f"{name}: __cuda_array_interface__ 'typestr' {typestr!r} is an object dtype, "
                f"which cannot live on a device"
            )
        if not dtype.isnative:
            raise ArgumentError(
                f"{name}: __cuda_array_interface__ 'typestr' {typestr!r} is not in native byte order"
            )
        if len(_checked_dtypes) < 256:  # typestrs are few; a stream of odd ones is not kept
            _checked_dtypes[typestr] = dtype
    if dtype.kind == "V" and declared is not None and dtype.itemsize == declared.itemsize:
        dtype = declared
    elif dtype.kind == "V":
        raise ArgumentError(
            f"{name}: __cuda_array_interface__ 'typestr' {typestr!r} is an opaque void type "
            f"(PyTorch exports bfloat16 this way); pass an object that also supports DLPack, "
            f"or a typed view"
        )

    # data
    data = cai.get("data", _MISSING)
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise ArgumentError(
            f"{name}: __cuda_array_interface__ 'data' must be a (ptr, readonly) tuple, got {data!r}"
        )
    ptr = _as_int(data[0])
    if ptr is None or ptr < 0:
        raise ArgumentError(
            f"{name}: __cuda_array_interface__ data pointer must be a non-negative int, "
            f"got {data[0]!r}"
        )
    if not isinstance(data[1], (bool, np.bool_)):
        raise ArgumentError(
            f"{name}: __cuda_array_interface__ 'data' readonly flag must be a bool, got {data[1]!r}"
        )
    readonly = bool(data[1])
    if ptr == 0 and size != 0:
        raise ArgumentError(
            f"{name}: __cuda_array_interface__ data pointer is NULL for a non-empty array "
            f"of shape {shape}"
        )

    # strides (optional; None means C-contiguous)
    strides_raw = cai.get("strides", None)
    strides: tuple[int, ...] | None
    if strides_raw is None:
        strides = None
    else:
        if not isinstance(strides_raw, (tuple, list)):
            raise ArgumentError(
                f"{name}: __cuda_array_interface__ 'strides' must be None or a tuple of ints, "
                f"got {strides_raw!r}"
            )
        stride_list = []
        for stride in strides_raw:
            stride_int = _as_int(stride)
            if stride_int is None:
                raise ArgumentError(
                    f"{name}: __cuda_array_interface__ 'strides' must contain ints, "
                    f"got {tuple(strides_raw)!r}"
                )
            stride_list.append(stride_int)
        strides = tuple(stride_list)
        if len(strides) != len(shape):
            raise ArgumentError(
                f"{name}: __cuda_array_interface__ 'strides' {strides} does not match "
                f"the {len(shape)} dimensions of shape {shape}"
            )

    # mask: masked arrays are not supported
    if cai.get("mask", None) is not None:
        raise ArgumentError(
            f"{name}: masked arrays are not supported "
            f"(__cuda_array_interface__ 'mask' must be None)"
        )

    # stream (v3): None = no synchronisation required, 1 = legacy default,
    # 2 = per-thread default, anything else a cudaStream_t.  0 is disallowed
    # by the specification because it is ambiguous.
    stream_raw = cai.get("stream", None)
    stream: int | None
    if stream_raw is None:
        stream = None
    else:
        stream = _as_int(stream_raw)
        if stream is None:
            raise ArgumentError(
                f"{name}: __cuda_array_interface__ 'stream' must be None or an int, "
                f"got {stream_raw!r}"
            )
        if stream == 0:
            raise ArgumentError(
                f"{name}: __cuda_array_interface__ 'stream' is 0, which the CUDA Array "
                f"Interface v3 disallows (ambiguous); producers must export 1 for the "
                f"legacy default stream or 2 for the per-thread default stream"
            )
        if stream < 0:
            raise ArgumentError(
                f"{name}: __cuda_array_interface__ 'stream' must be a positive int, got {stream}"
            )

    return DeviceArray(
        ptr=ptr,
        shape=shape,
        dtype=dtype,
        strides=strides,
        stream=stream,
        readonly=readonly,
        library=_detect_library(obj, "cai"),
        owner=obj,
    )


# --------------------------------------------------------------------------
# DLPack
# --------------------------------------------------------------------------

_KDL_CUDA = 2

_DL_DEVICE_NAMES = {
    1: "kDLCPU",
    2: "kDLCUDA",
    3: "kDLCUDAHost",
    4: "kDLOpenCL",
    7: "kDLVulkan",
    8: "kDLMetal",
    9: "kDLVPI",
    10: "kDLROCM",
    11: "kDLROCMHost",
    12: "kDLExtDev",
    13: "kDLCUDAManaged",
    14: "kDLOneAPI",
    15: "kDLWebGPU",
    16: "kDLHexagon",
    17: "kDLMAIA",
}

_DL_CODE_NAMES = {
    0: "kDLInt",
    1: "kDLUInt",
    2: "kDLFloat",
    3: "kDLOpaqueHandle",
    4: "kDLBfloat",
    5: "kDLComplex",
    6: "kDLBool",
}

_DLPACK_FLAG_READ_ONLY = 1 << 0
_DLPACK_SUPPORTED_MAJOR = 1


def _device_name(device_type: int) -> str:
    return _DL_DEVICE_NAMES.get(device_type, f"device type {device_type}")


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [
        ("dl_tensor", _DLTensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),  # void (*)(DLManagedTensor*)
    ]


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", _DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),  # void (*)(DLManagedTensorVersioned*)
        ("flags", ctypes.c_uint64),
        ("dl_tensor", _DLTensor),
    ]


# Private prototypes bound to the C-API (not mutating ctypes.pythonapi's
# shared function objects, which other code may configure differently).
# PYFUNCTYPE keeps the GIL held and turns a set Python error into an exception.
_PyCapsule_GetPointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)
_PyCapsule_SetName = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_SetName", ctypes.pythonapi)
)
_PyCapsule_IsValid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi)
)
_Py_IncRef = ctypes.PYFUNCTYPE(None, ctypes.py_object)(("Py_IncRef", ctypes.pythonapi))

# PyCapsule_SetName stores the char* it is given, and producers' capsule
# destructors later strcmp() against it (possibly during interpreter
# shutdown).  The DLPack spec therefore requires statically allocated names:
# we pass the internal buffer of these bytes objects and leak one reference
# so that the buffer can never be freed.
_NAME_DLTENSOR = b"dltensor"
_NAME_USED_DLTENSOR = b"used_dltensor"
_NAME_DLTENSOR_VERSIONED = b"dltensor_versioned"
_NAME_USED_DLTENSOR_VERSIONED = b"used_dltensor_versioned"
for _name_bytes in (
    _NAME_DLTENSOR,
    _NAME_USED_DLTENSOR,
    _NAME_DLTENSOR_VERSIONED,
    _NAME_USED_DLTENSOR_VERSIONED,
):
    _Py_IncRef(_name_bytes)
del _name_bytes

# The deleter is called without the GIL (CFUNCTYPE releases it): the DLPack
# Python spec requires deleters to acquire the GIL themselves if they need it.
_DLPACK_DELETER_T = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _call_dlpack_deleter(deleter_addr: int, managed_addr: int) -> None:
    """Invoke ``managed->deleter(managed)``.  Run exactly once by a finalizer."""
    _DLPACK_DELETER_T(deleter_addr)(managed_addr)


class _DLPackOwner:
    """Owns one consumed ``DLManagedTensor`` (``DeviceArray.owner`` for DLPack).

    Keeps the producer object and the (renamed, hence inert) capsule alive,
    and calls the tensor's deleter exactly once when this object is garbage
    collected (or at interpreter exit, whichever comes first).
    """

    __slots__ = ("producer", "capsule", "versioned", "_finalizer", "__weakref__")

    def __init__(self, producer: object, capsule: object, versioned: bool,
                 deleter_addr: int | None, managed_addr: int) -> None:
        self.producer = producer
        self.capsule = capsule
        self.versioned = versioned
        if deleter_addr:
            # The callback must not reference ``self`` (it would never die).
            self._finalizer = weakref.finalize(
                self, _call_dlpack_deleter, deleter_addr, managed_addr
            )
        else:
            self._finalizer = None  # the spec allows a NULL deleter

    @property
    def alive(self) -> bool:
        """False once the deleter has run."""
        return self._finalizer is not None and self._finalizer.alive


@dataclass(frozen=True)
class _DLPackTensorInfo:
    ptr: int                       # data + byte_offset
    shape: tuple[int, ...]
    dtype: np.dtype
    strides: tuple[int, ...] | None  # bytes; None when the producer gave NULL
    device_type: int
    device_id: int
    readonly: bool
    versioned: bool


def _dlpack_dtype(code: int, bits: int, lanes: int, name: str) -> np.dtype:
    what = (
        f"{_DL_CODE_NAMES.get(code, f'code {code}')}, bits={bits}, lanes={lanes}"
    )
    if lanes != 1:
        raise ArgumentError(f"{name}: vectorised DLPack dtypes are not supported ({what})")
    if code == 0 and bits in (8, 16, 32, 64):
        return np.dtype(f"int{bits}")
    if code == 1 and bits in (8, 16, 32, 64):
        return np.dtype(f"uint{bits}")
    if code == 2 and bits in (16, 32, 64):
        return np.dtype(f"float{bits}")
    if code == 5 and bits in (64, 128):
        return np.dtype(f"complex{bits}")
    if code == 6 and bits == 8:
        return np.dtype(np.bool_)
    if code == 4 and bits == 16:
        try:
            import ml_dtypes  # optional dependency
        except ImportError:
            raise ArgumentError(
                f"{name}: DLPack dtype bfloat16 needs the 'ml_dtypes' package, "
                f"which is not installed"
            ) from None
        return np.dtype(ml_dtypes.bfloat16)
    raise ArgumentError(f"{name}: unsupported DLPack dtype ({what})")


def _consume_dlpack_capsule(capsule: object, producer: object,
                            name: str) -> tuple[_DLPackTensorInfo, _DLPackOwner]:
    """Read a ``dltensor`` / ``dltensor_versioned`` capsule and take ownership.

    No device check is made here (the caller does it).  Everything is read and
    validated *before* the capsule is consumed: on any error the capsule is
    left untouched, so the producer's capsule destructor still frees it.  On
    success the capsule is renamed to ``used_dltensor[_versioned]`` and the
    returned owner calls the tensor's deleter once when it is collected.
    """
    if type(capsule).__name__ != "PyCapsule":
        raise ArgumentTypeError(
            f"{name}: __dlpack__() must return a PyCapsule, got {_type_name(capsule)}"
        )
    if _PyCapsule_IsValid(capsule, _NAME_DLTENSOR_VERSIONED):
        versioned = True
        cname, used_name = _NAME_DLTENSOR_VERSIONED, _NAME_USED_DLTENSOR_VERSIONED
    elif _PyCapsule_IsValid(capsule, _NAME_DLTENSOR):
        versioned = False
        cname, used_name = _NAME_DLTENSOR, _NAME_USED_DLTENSOR
    elif (_PyCapsule_IsValid(capsule, _NAME_USED_DLTENSOR)
          or _PyCapsule_IsValid(capsule, _NAME_USED_DLTENSOR_VERSIONED)):
        raise ArgumentError(f"{name}: the DLPack capsule has already been consumed")
    else:
        raise ArgumentTypeError(
            f"{name}: __dlpack__() returned a capsule not named 'dltensor' "
            f"or 'dltensor_versioned'"
        )

    managed_addr = _PyCapsule_GetPointer(capsule, cname)
    if not managed_addr:
        raise ArgumentError(f"{name}: the DLPack capsule holds a NULL DLManagedTensor")

    readonly = False
    if versioned:
        managed_v = _DLManagedTensorVersioned.from_address(managed_addr)
        major, minor = int(managed_v.version.major), int(managed_v.version.minor)
        if major != _DLPACK_SUPPORTED_MAJOR:
            # Per the spec the tensor must not be read; leave the capsule to
            # its producer's destructor.
            raise ArgumentError(
                f"{name}: DLPack version {major}.{minor} is not supported "
                f"(major version {_DLPACK_SUPPORTED_MAJOR} required)"
            )
        tensor = managed_v.dl_tensor
        deleter_addr = managed_v.deleter
        readonly = bool(managed_v.flags & _DLPACK_FLAG_READ_ONLY)
    else:
        managed = _DLManagedTensor.from_address(managed_addr)
        tensor = managed.dl_tensor
        deleter_addr = managed.deleter

    ndim = int(tensor.ndim)
    if ndim < 0:
        raise ArgumentError(f"{name}: DLPack tensor has negative ndim {ndim}")
    if ndim > 0 and not tensor.shape:
        raise ArgumentError(f"{name}: DLPack tensor has ndim {ndim} but a NULL shape")
    shape = tuple(int(tensor.shape[i]) for i in range(ndim))
    if any(extent < 0 for extent in shape):
        raise ArgumentError(f"{name}: DLPack tensor has a negative extent in shape {shape}")
    dtype = _dlpack_dtype(int(tensor.dtype.code), int(tensor.dtype.bits),
                          int(tensor.dtype.lanes), name)
    strides: tuple[int, ...] | None
    if tensor.strides:
        strides = tuple(int(tensor.strides[i]) * dtype.itemsize for i in range(ndim))
    else:
        strides = None  # NULL: compact row-major
    data = tensor.data or 0
    ptr = data + int(tensor.byte_offset)
    if data == 0 and math.prod(shape) != 0:
        raise ArgumentError(
            f"{name}: DLPack data pointer is NULL for a non-empty tensor of shape {shape}"
        )
    info = _DLPackTensorInfo(
        ptr=ptr,
        shape=shape,
        dtype=dtype,
        strides=strides,
        device_type=int(tensor.device.device_type),
        device_id=int(tensor.device.device_id),
        readonly=readonly,
        versioned=versioned,
    )

    # Take ownership: after the rename the producer's capsule destructor is a
    # no-op, and the owner's finalizer calls the deleter.
    if _PyCapsule_SetName(capsule, used_name) != 0:  # pragma: no cover - C-API failure
        raise ArgumentError(f"{name}: could not mark the DLPack capsule as consumed")
    owner = _DLPackOwner(producer, capsule, versioned, deleter_addr, managed_addr)
    return info, owner


def _check_consumer_stream(consumer_stream: object) -> int | None:
    if consumer_stream is None:
        return None
    value = _as_int(consumer_stream)
    if value is None:
        raise ArgumentTypeError(
            f"consumer_stream: expected None or an int, got {_type_name(consumer_stream)}"
        )
    if value == 0 or value < -1:
        raise ArgumentError(
            f"consumer_stream: {value} is not allowed by the DLPack protocol for CUDA "
            f"(use -1 for no synchronisation, None or 1 for the legacy default stream, "
            f"2 for the per-thread default stream, or a stream handle)"
        )
    return value


def _from_dlpack(obj: object, name: str, consumer_stream: int | None) -> DeviceArray:
    try:
        device = obj.__dlpack_device__()
        device_type, device_id = device
        device_type = int(device_type)
        int(device_id)
    except Exception as exc:
        raise ArgumentError(f"{name}: __dlpack_device__() failed: {exc}") from exc
    if device_type != _KDL_CUDA:
        raise ArgumentTypeError(
            f"{name}: must be on a CUDA device, got {_device_name(device_type)}"
        )

    # No max_version is passed: every producer then hands back the
    # unversioned "dltensor" capsule (the parser also understands
    # "dltensor_versioned" in case a producer returns one anyway).
    try:
        capsule = obj.__dlpack__(stream=consumer_stream)
    except Exception as exc:
        raise ArgumentError(f"{name}: __dlpack__() export failed: {exc}") from exc

    info, owner = _consume_dlpack_capsule(capsule, obj, name)
    if info.device_type != _KDL_CUDA:
        # ``owner`` is dropped here, which releases the tensor via its deleter.
        raise ArgumentTypeError(
            f"{name}: must be on a CUDA device, got {_device_name(info.device_type)} "
            f"(in the DLPack capsule; __dlpack_device__ said kDLCUDA)"
        )
    return DeviceArray(
        ptr=info.ptr,
        shape=info.shape,
        dtype=info.dtype,
        strides=info.strides,
        stream=None,
        readonly=info.readonly,
        library=_detect_library(obj, "dlpack"),
        owner=owner,
    )


# --------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------


def as_device_array(obj: Any, name: str, *, consumer_stream: int | None = -1) -> DeviceArray:
    """Describe a CUDA device array as a :class:`DeviceArray`.

    ``name`` is the argument name used in error messages.

    ``__cuda_array_interface__`` (v2/v3) is preferred; otherwise the DLPack
    protocol is used.  Exception: when the CAI element type is an opaque void
    type (PyTorch exports bfloat16 as ``'<V2'``) and the object also speaks
    DLPack, DLPack is used because it carries the real dtype.

    ``consumer_stream`` is only used for DLPack and is passed verbatim as
    ``__dlpack__(stream=...)``.  Its default, ``-1``,
    asks the producer for *no* synchronisation: the caller orders its own work
    (it resolves the launch stream with :func:`resolve_stream` and waits on
    producer streams itself), and a producer-side sync against an arbitrary
    stream would either be redundant or target the wrong stream.  Pass the
    launch stream's handle (1 = legacy default, 2 = per-thread default, or a
    handle) to make the producer order its pending work before that stream
    instead; ``None`` means "assume the legacy default stream" per the spec.

    DLPack arrays report ``stream=None``; their ``owner`` calls the
    ``DLManagedTensor`` deleter when garbage collected.

    Raises ArgumentTypeError for objects that are not CUDA arrays (including
    host arrays such as NumPy arrays and CPU DLPack tensors), and
    ArgumentError for malformed or unsupported interface contents.
    """
    if isinstance(obj, np.ndarray):
        raise ArgumentTypeError(
            f"{name}: expected a CUDA array (__cuda_array_interface__ or DLPack), "
            f"got {_type_name(obj)}; host arrays are not accepted"
        )

    try:
        cai = getattr(obj, "__cuda_array_interface__", _MISSING)  # read once
    except Exception as exc:
        # e.g. torch raises RuntimeError for tensors that require grad
        raise ArgumentError(
            f"{name}: reading __cuda_array_interface__ failed: {exc}"
        ) from exc
    plain = _plain_cai_array(obj, cai)
    if plain is not None:
        return plain
    has_dlpack = hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__")
    if cai is not _MISSING:
        if _cai_is_opaque(cai):
            declared = _declared_bfloat16(obj)
            if declared is not None:
                # A CuPy >= 14 bfloat16 array or a Bfloat16Array: the CAI says
                # '<V2', the object's own dtype says bfloat16.
                return _from_cai(obj, cai, name, declared)
            if has_dlpack:
                # e.g. a torch.bfloat16 tensor: CAI says '<V2', DLPack says bfloat16.
                return _from_dlpack(obj, name, _check_consumer_stream(consumer_stream))
        return _from_cai(obj, cai, name)

    if has_dlpack:
        return _from_dlpack(obj, name, _check_consumer_stream(consumer_stream))

    raise ArgumentTypeError(
        f"{name}: expected a CUDA array (__cuda_array_interface__ or DLPack), "
        f"got {_type_name(obj)}"
    )


def _declared_bfloat16(obj: object) -> np.dtype | None:
    """ml_dtypes' bfloat16 when ``obj.dtype`` is it (NumPy-style dtypes only:
    a torch dtype is not one and takes the DLPack route)."""
    try:
        dtype = np.dtype(getattr(obj, "dtype"))
    except Exception:
        return None
    return dtype if dtype.name == "bfloat16" and dtype.itemsize == 2 else None


class Bfloat16Array:
    """A bfloat16 view of a CUDA array of 2-byte elements holding bfloat16 bit
    patterns (e.g. a CuPy ``uint16`` array), for array libraries that cannot
    hold bfloat16 themselves (CuPy before 14, or without ml_dtypes).

    It exposes the base array's ``__cuda_array_interface__`` with the opaque
    typestr ``'<V2'`` and ``dtype`` bfloat16 (ml_dtypes), which is how
    :func:`as_device_array` recognises bfloat16 on the CAI route. ``base`` is
    the storage; streams and allocations follow its library.
    """

    __slots__ = ("base",)

    def __init__(self, base: Any) -> None:
        try:
            cai = base.__cuda_array_interface__
        except AttributeError:
            raise ArgumentTypeError(
                f"bfloat16_view: expected a CUDA array with __cuda_array_interface__, got {_type_name(base)}"
            ) from None
        try:
            itemsize = np.dtype(cai["typestr"]).itemsize
        except Exception:
            itemsize = None
        if itemsize != 2:
            raise ArgumentTypeError(
                f"bfloat16_view: the base array must have 2-byte elements (e.g. uint16), "
                f"got typestr {cai.get('typestr')!r}"
            )
        self.base = base

    @property
    def __cuda_array_interface__(self) -> dict:
        cai = dict(self.base.__cuda_array_interface__)  # fresh: CuPy fills 'stream' per access
        cai["typestr"] = "<V2"
        cai["descr"] = [("", "<V2")]
        return cai

    @property
    def dtype(self) -> np.dtype:
        import ml_dtypes  # noqa: PLC0415 - optional dependency, needed only here

        return np.dtype(ml_dtypes.bfloat16)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.base.__cuda_array_interface__["shape"])

    @property
    def device(self) -> Any:
        return getattr(self.base, "device", None)

    def __repr__(self) -> str:
        return f"Bfloat16Array(shape={self.shape}, base={_type_name(self.base)})"


def bfloat16_view(array: Any) -> Bfloat16Array:
    """Reinterpret a CUDA array of bfloat16 bit patterns (2-byte elements, e.g.
    CuPy ``uint16``) as bfloat16 for ferrum_ffi; no copy. ``view.base`` is the
    array itself."""
    return Bfloat16Array(array)


def _stream_from_protocol(stream: object) -> int:
    attr = stream.__cuda_stream__
    value = attr() if callable(attr) else attr
    if not isinstance(value, tuple) or len(value) != 2:
        raise ArgumentTypeError(
            f"stream: __cuda_stream__ must give a (version, handle) tuple, got {value!r}"
        )
    version, handle_raw = value
    handle = _as_int(handle_raw)
    if _as_int(version) is None or handle is None:
        raise ArgumentTypeError(
            f"stream: __cuda_stream__ must give a (version, handle) tuple of ints, got {value!r}"
        )
    if handle < 0:
        raise ArgumentError(f"stream: __cuda_stream__ handle must be >= 0, got {handle}")
    return handle


def _current_stream(arrays: Sequence[DeviceArray]) -> int:
    # The first array coming from a library with a notion of "current
    # stream" decides; without one we use the legacy default stream (0).
    for array in arrays:
        library = getattr(array, "library", None)
        if library == "cupy":
            import cupy  # lazily: only when a CuPy array was passed

            return int(cupy.cuda.get_current_stream().ptr)
        if library == "torch":
            import torch  # lazily: only when a PyTorch tensor was passed

            return int(torch.cuda.current_stream().cuda_stream)
    return 0


def resolve_stream(stream: Any, arrays: Sequence[DeviceArray] = ()) -> int:
    """Turn ``stream`` into an integer ``cudaStream_t`` (0 = legacy default).

    Accepted: objects implementing ``__cuda_stream__`` (method or tuple
    attribute giving ``(version, handle)``), CuPy streams (``.ptr``), PyTorch
    streams (``.cuda_stream``), Numba streams (``.handle.value``), non-negative
    ints, and None.  None means the current stream of the library the arrays
    come from: the first array from CuPy or PyTorch decides (that library's
    current stream on its current device); with none of those, 0.
    """
    if isinstance(stream, (bool, np.bool_)):
        raise ArgumentTypeError("stream: expected a CUDA stream or int handle, got bool")
    if stream is None:
        return _current_stream(arrays)
    if isinstance(stream, numbers.Integral):
        handle = int(stream)
        if handle < 0:
            raise ArgumentError(f"stream: a stream handle must be >= 0, got {handle}")
        return handle
    if hasattr(stream, "__cuda_stream__"):
        return _stream_from_protocol(stream)

    top = _top_module(stream)
    if top in ("cupy", "cupy_backends") and hasattr(stream, "ptr"):
        handle = _as_int(stream.ptr)
    elif top == "torch" and hasattr(stream, "cuda_stream"):
        handle = _as_int(stream.cuda_stream)
    elif hasattr(stream, "handle") and hasattr(stream.handle, "value"):
        value = stream.handle.value  # ctypes c_void_p: None for NULL
        handle = 0 if value is None else _as_int(value)
    else:
        raise ArgumentTypeError(
            f"stream: expected a CUDA stream (__cuda_stream__, CuPy, PyTorch or Numba "
            f"stream), an int handle or None, got {_type_name(stream)}"
        )
    if handle is None or handle < 0:
        raise ArgumentError(
            f"stream: {_type_name(stream)} did not give a valid stream handle"
        )
    return handle


def _canonical_stream(handle: int) -> int:
    # 0 and 1 both name the legacy default stream; 2 (per-thread default)
    # and real handles are distinct streams.
    return 1 if handle in (0, 1) else handle


def producer_streams_to_wait(arrays: Sequence[DeviceArray], stream: int) -> list[int]:
    """Producer streams that ``stream`` must wait on before reading ``arrays``.

    CUDA Array Interface v3 synchronisation rule: when a producer exports
    ``'stream': S`` (not None), work that produces the data may still be
    pending on ``S``; a consumer that accesses the data on a different stream
    must first make its stream wait for ``S`` (e.g. record an event on ``S``
    and ``cudaStreamWaitEvent`` it on the consumer stream), which keeps
    everything asynchronous.  ``'stream': None`` means the producer asks for
    no synchronisation.  Nothing is needed when ``S`` is the consumer stream
    itself; 0 and 1 are treated as the same (legacy default) stream, while
    2 (per-thread default) is a distinct stream.

    Returns the distinct such producer handles in first-seen order; the
    caller performs the waits.  DLPack arrays (stream None) never contribute:
    their synchronisation is negotiated through ``__dlpack__(stream=...)``.
    """
    target = _canonical_stream(int(stream))
    seen: set[int] = set()
    result: list[int] = []
    for array in arrays:
        producer = array.stream
        if producer is None:
            continue
        key = _canonical_stream(int(producer))
        if key == target or key in seen:
            continue
        seen.add(key)
        result.append(int(producer))
    return result
