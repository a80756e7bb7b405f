"""CPU-only tests for ferrum_ffi._interop, using fake producers."""

from __future__ import annotations

import ctypes
import gc
import subprocess
import sys
import types

import numpy as np
import pytest

from ferrum_ffi import _interop
from ferrum_ffi._interop import (
    DeviceArray,
    as_device_array,
    producer_streams_to_wait,
    resolve_stream,
)
from ferrum_ffi.status import ArgumentError, ArgumentTypeError

PTR = 0x7F00_0000_1000


# ---------------------------------------------------------------------------
# Fake producers
# ---------------------------------------------------------------------------


class FakeCAI:
    """Exposes ``__cuda_array_interface__`` as a property; counts reads."""

    def __init__(self, **cai):
        self._cai = cai
        self.reads = 0

    @property
    def __cuda_array_interface__(self):
        self.reads += 1
        return dict(self._cai)


def cai(version=3, shape=(4,), typestr="<f4", ptr=PTR, readonly=False, **extra):
    d = {"version": version, "shape": shape, "typestr": typestr, "data": (ptr, readonly)}
    d.update(extra)
    return d


def make_cai(**kw):
    return FakeCAI(**cai(**kw))


def with_module(cls, module):
    """A subclass of ``cls`` whose type pretends to live in ``module``."""
    return type(cls.__name__, (cls,), {"__module__": module})


# --- fake CUDA DLPack producer built from raw ctypes structs ---------------

_PyCapsule_New = ctypes.PYFUNCTYPE(
    ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p
)(("PyCapsule_New", ctypes.pythonapi))
_PyCapsule_IsValid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi)
)
# Capsule names must outlive the capsules: leak one reference to each.
_CAP_NAME = b"dltensor"
_CAP_NAME_V = b"dltensor_versioned"
_CAP_NAME_FOREIGN = b"something_else"
for _n in (_CAP_NAME, _CAP_NAME_V, _CAP_NAME_FOREIGN):
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(_n))


class FakeCudaDLPack:
    """A DLPack producer whose capsule describes a (fake) CUDA tensor.

    The capsule is created without a destructor, so only a consumer that
    takes ownership calls ``deleter``; ``self.deleted`` counts those calls.
    """

    def __init__(self, shape=(2, 3), strides=None, code=2, bits=32, lanes=1,
                 data=PTR, byte_offset=0, device=(2, 0), tensor_device=None,
                 versioned=False, version=(1, 0), flags=0, with_deleter=True,
                 raise_on_export=None):
        self.device = device
        self.calls = []
        self.deleted = 0
        self.versioned = versioned
        self.raise_on_export = raise_on_export
        ndim = len(shape)
        self._shape = (ctypes.c_int64 * max(ndim, 1))(*shape)
        self._strides = None if strides is None else (ctypes.c_int64 * max(ndim, 1))(*strides)
        td = tensor_device if tensor_device is not None else device
        tensor = _interop._DLTensor(
            data=data,
            device=_interop._DLDevice(*td),
            ndim=ndim,
            dtype=_interop._DLDataType(code, bits, lanes),
            shape=ctypes.cast(self._shape, ctypes.POINTER(ctypes.c_int64)),
            strides=(ctypes.cast(self._strides, ctypes.POINTER(ctypes.c_int64))
                     if self._strides is not None else None),
            byte_offset=byte_offset,
        )
        self._deleter = _interop._DLPACK_DELETER_T(self._on_delete)
        deleter_addr = ctypes.cast(self._deleter, ctypes.c_void_p).value if with_deleter else None
        if versioned:
            self.managed = _interop._DLManagedTensorVersioned(
                version=_interop._DLPackVersion(*version), manager_ctx=None,
                deleter=deleter_addr, flags=flags, dl_tensor=tensor)
        else:
            self.managed = _interop._DLManagedTensor(
                dl_tensor=tensor, manager_ctx=None, deleter=deleter_addr)

    def _on_delete(self, managed_addr):
        assert managed_addr == ctypes.addressof(self.managed)
        self.deleted += 1

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, *, stream=None, max_version=None):
        self.calls.append({"stream": stream, "max_version": max_version})
        if self.raise_on_export is not None:
            raise self.raise_on_export
        self.capsule = _PyCapsule_New(
            ctypes.addressof(self.managed), _CAP_NAME_V if self.versioned else _CAP_NAME, None)
        return self.capsule


class NumpyDLPackWrapper:
    """Not an ndarray, but exposes NumPy's own DLPack methods (CPU device)."""

    def __init__(self, arr):
        self.arr = arr
        self.exported = 0

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()

    def __dlpack__(self, **kw):
        self.exported += 1
        return self.arr.__dlpack__(**kw)


# ---------------------------------------------------------------------------
# CUDA Array Interface
# ---------------------------------------------------------------------------


def test_cai_v3_basic_fields():
    obj = make_cai(shape=(2, 3), typestr="<f4", stream=5)
    a = as_device_array(obj, "a")
    assert a.ptr == PTR
    assert a.shape == (2, 3)
    assert a.dtype == np.float32
    assert a.strides is None
    assert a.stream == 5
    assert a.readonly is False
    assert a.library == "cai"
    assert a.owner is obj
    assert a.size == 6 and a.itemsize == 4 and a.nbytes == 24 and a.ndim == 2
    assert a.is_c_contiguous


def test_cai_property_read_once():
    obj = make_cai()
    as_device_array(obj, "a")
    assert obj.reads == 1


def test_cai_v2_accepted_without_stream():
    a = as_device_array(make_cai(version=2), "a")
    assert a.stream is None


@pytest.mark.parametrize("version", [0, 1, "3", None, True])
def test_cai_bad_version_rejected(version):
    with pytest.raises(ArgumentError, match=r"^a: .*version"):
        as_device_array(make_cai(version=version), "a")


def test_cai_missing_version_rejected():
    d = cai()
    del d["version"]
    with pytest.raises(ArgumentError, match=r"a: .*no 'version'"):
        as_device_array(FakeCAI(**d), "a")


def test_cai_not_a_dict_rejected():
    class Weird:
        __cuda_array_interface__ = [1, 2]

    with pytest.raises(ArgumentTypeError, match="a: __cuda_array_interface__ must be a dict"):
        as_device_array(Weird(), "a")


@pytest.mark.parametrize("typestr,dtype", [
    ("<f2", np.float16), ("<i4", np.int32), ("|u1", np.uint8),
    ("<f8", np.float64), ("|b1", np.bool_), ("<c8", np.complex64),
])
def test_cai_typestr_mapping(typestr, dtype):
    a = as_device_array(make_cai(typestr=typestr), "x")
    assert a.dtype == np.dtype(dtype)
    assert a.itemsize == np.dtype(dtype).itemsize


@pytest.mark.parametrize("typestr", ["<q7", "garbage", "|O", ">f4", 5])
def test_cai_bad_typestr_rejected(typestr):
    with pytest.raises(ArgumentError, match=r"^x: .*typestr"):
        as_device_array(make_cai(typestr=typestr), "x")


def test_cai_void_typestr_rejected():
    with pytest.raises(ArgumentError, match="x: .*'<V2' is an opaque void type"):
        as_device_array(make_cai(typestr="<V2"), "x")


def test_cai_void_typestr_falls_back_to_dlpack():
    class TorchBF16(FakeCudaDLPack):
        __module__ = "torch"
        __cuda_array_interface__ = cai(typestr="<V2", shape=(2, 3))

    prod = TorchBF16(code=4, bits=16)
    try:
        import ml_dtypes
    except ImportError:
        with pytest.raises(ArgumentError, match="bfloat16 needs the 'ml_dtypes'"):
            as_device_array(prod, "a")
    else:
        a = as_device_array(prod, "a")
        assert a.dtype == np.dtype(ml_dtypes.bfloat16)
        assert a.library == "torch" and a.stream is None
    assert len(prod.calls) == 1


def test_cai_descr_ignored():
    a = as_device_array(make_cai(descr=[("", "<f4")]), "a")
    assert a.dtype == np.float32


def test_cai_readonly():
    assert as_device_array(make_cai(readonly=True), "a").readonly is True
    assert as_device_array(make_cai(readonly=False), "a").readonly is False


@pytest.mark.parametrize("data", [None, (PTR,), (PTR, 1), ("0x10", False), (-1, False)])
def test_cai_bad_data_rejected(data):
    d = cai()
    d["data"] = data
    with pytest.raises(ArgumentError, match=r"^a: .*data"):
        as_device_array(FakeCAI(**d), "a")


def test_cai_null_pointer_size_zero_ok():
    a = as_device_array(make_cai(shape=(0, 5), ptr=0), "a")
    assert a.ptr == 0 and a.size == 0 and a.nbytes == 0


def test_cai_null_pointer_nonempty_rejected():
    with pytest.raises(ArgumentError, match="a: .*NULL"):
        as_device_array(make_cai(shape=(1,), ptr=0), "a")


def test_cai_strides():
    a = as_device_array(make_cai(shape=(3, 4), typestr="<f4", strides=(4, 12)), "a")
    assert a.strides == (4, 12)
    assert not a.is_c_contiguous
    b = as_device_array(make_cai(shape=(3, 4), typestr="<f4", strides=(16, 4)), "a")
    assert b.strides == (16, 4)
    assert b.is_c_contiguous
    c = as_device_array(make_cai(shape=(3, 4), strides=None), "a")
    assert c.strides is None


@pytest.mark.parametrize("strides", [(4,), 16, (4.0, 4), (None, 4)])
def test_cai_bad_strides_rejected(strides):
    with pytest.raises(ArgumentError, match="a: .*strides"):
        as_device_array(make_cai(shape=(3, 4), strides=strides), "a")


@pytest.mark.parametrize("shape", [(-1,), (2.0,), 4, None, (True,)])
def test_cai_bad_shape_rejected(shape):
    with pytest.raises(ArgumentError, match="a: .*shape"):
        as_device_array(make_cai(shape=shape), "a")


def test_cai_numpy_ints_in_fields_accepted():
    a = as_device_array(make_cai(shape=(np.int64(2),), ptr=np.uint64(PTR),
                                 strides=(np.int32(8),)), "a")
    assert a.shape == (2,) and a.ptr == PTR and a.strides == (8,)
    assert type(a.shape[0]) is int and type(a.ptr) is int


PLAIN_CAIS = [
    dict(shape=(2, 3), typestr="<f2", stream=1),
    dict(shape=(4,), typestr="<i4", stream=None, data=(PTR, True)),
    dict(shape=(3, 5), typestr="<f4", strides=(40, 4), stream=2),
    dict(shape=(0, 7), typestr="<u1", version=2),
]


@pytest.mark.parametrize("fields", PLAIN_CAIS)
def test_cai_plain_fast_path_matches_the_general_parse(fields):
    # The plain interface (exact ints, tuples, bools; a typestr seen before)
    # takes a fast path: the record must be the general parse's, field by field.
    obj = with_module(FakeCAI, "cupy._core.core")(**cai(**fields))
    general = _interop._from_cai(obj, obj.__cuda_array_interface__, "a")  # also marks the typestr as checked
    fast = _interop._plain_cai_array(obj, obj.__cuda_array_interface__)
    assert fast is not None
    assert fast == general and fast.owner is general.owner and fast.library == general.library == "cupy"
    assert as_device_array(obj, "a") == general


@pytest.mark.parametrize("fields", [
    dict(shape=[2, 3]), dict(shape=(np.int64(2), 3)), dict(version=np.int32(3)), dict(data=(PTR, np.bool_(False))),
    dict(strides=[12, 4]), dict(data=(0, False), shape=(0,)), dict(typestr="<V2"),
])
def test_cai_other_forms_take_the_general_parse(fields):
    # Lists, NumPy scalars, a NULL pointer, opaque types: the fast path declines
    # (the general parse accepts or rejects them with its messages).
    obj = FakeCAI(**cai(**fields))
    _interop._from_cai(obj, cai(shape=(1,)), "warm-up")  # '<f4' is a checked typestr
    assert _interop._plain_cai_array(obj, obj.__cuda_array_interface__) is None


@pytest.mark.parametrize("fields", [dict(shape=(True, 2)), dict(stream=0), dict(stream=-3), dict(version=1),
                                    dict(mask=(PTR, False)), dict(strides=(4, 4))])
def test_cai_invalid_plain_looking_forms_still_rejected(fields):
    obj = FakeCAI(**cai(**fields))
    _interop._from_cai(obj, cai(shape=(1,)), "warm-up")
    with pytest.raises(ArgumentError):
        as_device_array(obj, "a")


def test_cai_mask_rejected():
    with pytest.raises(ArgumentError, match="a: masked arrays are not supported"):
        as_device_array(make_cai(mask=FakeCAI()), "a")


def test_cai_mask_none_ok():
    assert as_device_array(make_cai(mask=None), "a").ptr == PTR


def test_cai_stream_zero_rejected():
    with pytest.raises(ArgumentError, match=r"a: .*'stream' is 0.*disallow"):
        as_device_array(make_cai(stream=0), "a")


@pytest.mark.parametrize("stream", [1, 2, 0xDEAD0000, None])
def test_cai_stream_valid(stream):
    assert as_device_array(make_cai(stream=stream), "a").stream == stream


@pytest.mark.parametrize("stream", [-3, "1", 1.0, True])
def test_cai_stream_bad_rejected(stream):
    with pytest.raises(ArgumentError, match="a: .*'stream'"):
        as_device_array(make_cai(stream=stream), "a")


def test_cai_property_raising_is_reported():
    class RequiresGrad:
        @property
        def __cuda_array_interface__(self):
            raise RuntimeError("Can't get __cuda_array_interface__ on Variable that requires grad")

    with pytest.raises(ArgumentError, match="w: reading __cuda_array_interface__ failed: Can't"):
        as_device_array(RequiresGrad(), "w")


@pytest.mark.parametrize("module,library", [
    ("cupy._core.core", "cupy"),
    ("cupy", "cupy"),
    ("torch", "torch"),
    ("torch.nn.parameter", "torch"),
    ("jaxlib.xla_extension", "jax"),
    ("jax._src.array", "jax"),
    ("numba.cuda.cudadrv.devicearray", "numba"),
    ("cupyish", "cai"),
    ("mylib.arrays", "cai"),
])
def test_cai_library_detection(module, library):
    cls = with_module(FakeCAI, module)
    assert as_device_array(cls(**cai()), "a").library == library


def test_cai_preferred_over_dlpack():
    class Both(FakeCAI):
        def __dlpack__(self, **kw):  # pragma: no cover - must not be called
            raise AssertionError("DLPack used although CAI is present")

        def __dlpack_device__(self):  # pragma: no cover
            raise AssertionError

    a = as_device_array(Both(**cai()), "a")
    assert a.library == "cai"


# ---------------------------------------------------------------------------
# Rejection of non-device objects
# ---------------------------------------------------------------------------


def test_numpy_array_rejected_as_host_array():
    with pytest.raises(ArgumentTypeError) as ei:
        as_device_array(np.arange(3), "a")
    msg = str(ei.value)
    assert msg.startswith("a: expected a CUDA array (__cuda_array_interface__ or DLPack), "
                          "got numpy.ndarray")
    assert "host arrays are not accepted" in msg


@pytest.mark.parametrize("obj,tname", [([1, 2], "list"), (3, "int"), (None, "NoneType"),
                                       (object(), "object")])
def test_other_objects_rejected(obj, tname):
    with pytest.raises(ArgumentTypeError, match=rf"^b: expected a CUDA array .*got {tname}$"):
        as_device_array(obj, "b")


def test_dlpack_numpy_cpu_rejected():
    wrapper = NumpyDLPackWrapper(np.arange(4, dtype=np.float32))
    with pytest.raises(ArgumentTypeError, match="a: must be on a CUDA device, got kDLCPU"):
        as_device_array(wrapper, "a")
    assert wrapper.exported == 0  # rejected before exporting


def test_dlpack_unknown_device_type_named():
    prod = FakeCudaDLPack(device=(99, 0))
    with pytest.raises(ArgumentTypeError, match="must be on a CUDA device, got device type 99"):
        as_device_array(prod, "a")


def test_dlpack_only_half_protocol_rejected():
    class OnlyDLPack:
        def __dlpack__(self, **kw):  # pragma: no cover
            raise AssertionError

    with pytest.raises(ArgumentTypeError, match="expected a CUDA array"):
        as_device_array(OnlyDLPack(), "a")


# ---------------------------------------------------------------------------
# DLPack path (fake CUDA producer)
# ---------------------------------------------------------------------------


def test_dlpack_cuda_basic_and_deleter_once():
    prod = FakeCudaDLPack(shape=(2, 3), code=2, bits=32, byte_offset=64)
    a = as_device_array(prod, "a")
    assert a.ptr == PTR + 64
    assert a.shape == (2, 3)
    assert a.dtype == np.float32
    assert a.strides is None and a.is_c_contiguous
    assert a.stream is None
    assert a.readonly is False
    assert a.library == "dlpack"
    assert a.owner.producer is prod
    # ownership taken: capsule renamed, deleter not yet called
    assert _PyCapsule_IsValid(prod.capsule, b"used_dltensor")
    assert prod.deleted == 0
    assert a.owner.alive
    owner = a.owner
    del a
    gc.collect()
    assert prod.deleted == 0  # owner still referenced
    del owner
    gc.collect()
    assert prod.deleted == 1
    gc.collect()
    assert prod.deleted == 1


def test_dlpack_default_consumer_stream_is_minus_one():
    prod = FakeCudaDLPack()
    as_device_array(prod, "a")
    assert prod.calls == [{"stream": -1, "max_version": None}]


@pytest.mark.parametrize("stream", [None, 1, 2, 0x5000])
def test_dlpack_consumer_stream_passed_through(stream):
    prod = FakeCudaDLPack()
    as_device_array(prod, "a", consumer_stream=stream)
    assert prod.calls[0]["stream"] == stream


@pytest.mark.parametrize("stream,exc", [(0, ArgumentError), (-2, ArgumentError),
                                        (True, ArgumentTypeError), ("s", ArgumentTypeError)])
def test_dlpack_bad_consumer_stream_rejected(stream, exc):
    prod = FakeCudaDLPack()
    with pytest.raises(exc, match="consumer_stream"):
        as_device_array(prod, "a", consumer_stream=stream)
    assert prod.calls == []


def test_dlpack_strides_converted_to_bytes():
    prod = FakeCudaDLPack(shape=(3, 4), strides=(1, 3), code=2, bits=64)
    a = as_device_array(prod, "a")
    assert a.strides == (8, 24)
    assert not a.is_c_contiguous
    prod2 = FakeCudaDLPack(shape=(3, 4), strides=(4, 1), code=0, bits=16)
    b = as_device_array(prod2, "a")
    assert b.strides == (8, 2) and b.is_c_contiguous


@pytest.mark.parametrize("code,bits,dtype", [
    (0, 8, np.int8), (0, 64, np.int64), (1, 8, np.uint8), (1, 16, np.uint16),
    (2, 16, np.float16), (2, 64, np.float64), (5, 64, np.complex64), (6, 8, np.bool_),
])
def test_dlpack_dtype_mapping(code, bits, dtype):
    assert as_device_array(FakeCudaDLPack(code=code, bits=bits), "a").dtype == np.dtype(dtype)


@pytest.mark.parametrize("code,bits,lanes,match", [
    (2, 32, 4, "vectorised"), (0, 12, 1, "unsupported DLPack dtype"),
    (3, 64, 1, "kDLOpaqueHandle"), (9, 8, 1, "code 9"),
])
def test_dlpack_bad_dtype_rejected_without_consuming(code, bits, lanes, match):
    prod = FakeCudaDLPack(code=code, bits=bits, lanes=lanes)
    with pytest.raises(ArgumentError, match=match):
        as_device_array(prod, "a")
    # capsule left to the producer: still named "dltensor", deleter not called
    assert _PyCapsule_IsValid(prod.capsule, b"dltensor")
    gc.collect()
    assert prod.deleted == 0


def test_dlpack_bfloat16():
    prod = FakeCudaDLPack(code=4, bits=16)
    try:
        import ml_dtypes
    except ImportError:
        with pytest.raises(ArgumentError, match="bfloat16 needs the 'ml_dtypes'"):
            as_device_array(prod, "a")
    else:
        assert as_device_array(prod, "a").dtype == np.dtype(ml_dtypes.bfloat16)


def test_dlpack_null_data():
    a = as_device_array(FakeCudaDLPack(shape=(0, 3), data=0), "a")
    assert a.ptr == 0 and a.size == 0
    with pytest.raises(ArgumentError, match="NULL"):
        as_device_array(FakeCudaDLPack(shape=(1, 3), data=0), "a")


def test_dlpack_scalar():
    a = as_device_array(FakeCudaDLPack(shape=()), "a")
    assert a.shape == () and a.size == 1 and a.is_c_contiguous


def test_dlpack_tensor_device_mismatch_rejected_and_released():
    prod = FakeCudaDLPack(device=(2, 0), tensor_device=(1, 0))
    with pytest.raises(ArgumentTypeError, match="got kDLCPU"):
        as_device_array(prod, "a")
    gc.collect()
    assert prod.deleted == 1


def test_dlpack_export_failure_reported():
    prod = FakeCudaDLPack(raise_on_export=BufferError("cannot export"))
    with pytest.raises(ArgumentError, match="a: __dlpack__\\(\\) export failed: cannot export"):
        as_device_array(prod, "a")


def test_dlpack_versioned_readonly():
    prod = FakeCudaDLPack(versioned=True, flags=1)
    a = as_device_array(prod, "a")
    assert a.readonly is True
    assert _PyCapsule_IsValid(prod.capsule, b"used_dltensor_versioned")
    del a
    gc.collect()
    assert prod.deleted == 1


def test_dlpack_versioned_bad_major_rejected():
    prod = FakeCudaDLPack(versioned=True, version=(2, 0))
    with pytest.raises(ArgumentError, match="DLPack version 2.0 is not supported"):
        as_device_array(prod, "a")
    assert _PyCapsule_IsValid(prod.capsule, b"dltensor_versioned")
    assert prod.deleted == 0


def test_dlpack_null_deleter_allowed():
    prod = FakeCudaDLPack(with_deleter=False)
    a = as_device_array(prod, "a")
    assert not a.owner.alive
    del a
    gc.collect()
    assert prod.deleted == 0


def test_dlpack_library_detection():
    cls = with_module(FakeCudaDLPack, "torch")
    assert as_device_array(cls(), "a").library == "torch"


def test_dlpack_non_capsule_rejected():
    class BadProducer:
        def __dlpack_device__(self):
            return (2, 0)

        def __dlpack__(self, **kw):
            return b"not a capsule"

    with pytest.raises(ArgumentTypeError, match="must return a PyCapsule"):
        as_device_array(BadProducer(), "a")


# ---------------------------------------------------------------------------
# Capsule parser on real NumPy capsules (no device check)
# ---------------------------------------------------------------------------


def test_parse_numpy_capsule(monkeypatch):
    calls = []
    original = _interop._call_dlpack_deleter

    def counting(deleter, managed):
        calls.append(managed)
        original(deleter, managed)

    monkeypatch.setattr(_interop, "_call_dlpack_deleter", counting)

    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    arr = base[:, ::2]
    refs_before = sys.getrefcount(arr)
    capsule = arr.__dlpack__()
    info, owner = _interop._consume_dlpack_capsule(capsule, arr, "a")
    assert info.device_type == 1
    assert info.shape == (4, 3)
    assert info.strides == arr.strides == (24, 8)
    assert info.dtype == np.float32
    assert info.ptr == arr.ctypes.data
    assert info.readonly is False and info.versioned is False
    assert _PyCapsule_IsValid(capsule, b"used_dltensor")
    assert calls == []

    # a second consumption of the same capsule is refused
    with pytest.raises(ArgumentError, match="already been consumed"):
        _interop._consume_dlpack_capsule(capsule, arr, "a")

    del capsule, owner, info
    gc.collect()
    assert len(calls) == 1
    # NumPy's deleter dropped exactly the reference its export took.
    assert sys.getrefcount(arr) == refs_before
    gc.collect()
    assert len(calls) == 1


def test_parse_numpy_capsule_contiguous_and_int():
    arr = np.arange(6, dtype=np.int16).reshape(2, 3)
    info, owner = _interop._consume_dlpack_capsule(arr.__dlpack__(), arr, "a")
    assert info.shape == (2, 3) and info.dtype == np.int16
    assert info.strides in (None, (6, 2))
    assert info.ptr == arr.ctypes.data


def test_parse_numpy_versioned_readonly_capsule():
    arr = np.arange(5, dtype=np.float64)
    arr.flags.writeable = False
    refs_before = sys.getrefcount(arr)
    capsule = arr.__dlpack__(max_version=(1, 0))
    info, owner = _interop._consume_dlpack_capsule(capsule, arr, "a")
    assert info.versioned and info.readonly
    assert info.shape == (5,) and info.dtype == np.float64
    assert info.ptr == arr.ctypes.data
    assert _PyCapsule_IsValid(capsule, b"used_dltensor_versioned")
    del capsule, owner, info
    gc.collect()
    assert sys.getrefcount(arr) == refs_before


def test_parse_numpy_capsule_survives_producer_deletion():
    import weakref

    arr = np.arange(8, dtype=np.uint8)
    ref = weakref.ref(arr)
    info, owner = _interop._consume_dlpack_capsule(arr.__dlpack__(), None, "a")
    del arr
    gc.collect()
    assert ref() is not None  # kept alive by the DLManagedTensor
    assert ctypes.string_at(info.ptr, 8) == bytes(range(8))
    del owner
    gc.collect()
    assert ref() is None


def test_parser_rejects_non_capsule_and_foreign_capsule():
    with pytest.raises(ArgumentTypeError, match="must return a PyCapsule"):
        _interop._consume_dlpack_capsule(object(), None, "a")
    foreign = _PyCapsule_New(0x10, _CAP_NAME_FOREIGN, None)
    with pytest.raises(ArgumentTypeError, match="not named 'dltensor'"):
        _interop._consume_dlpack_capsule(foreign, None, "a")


# ---------------------------------------------------------------------------
# DeviceArray properties
# ---------------------------------------------------------------------------


def _da(shape, strides, dtype=np.float32):
    return DeviceArray(ptr=PTR, shape=shape, dtype=np.dtype(dtype), strides=strides,
                       stream=None, readonly=False, library="cai", owner=None)


@pytest.mark.parametrize("shape,strides,expected", [
    ((2, 3), None, True),
    ((2, 3), (12, 4), True),
    ((2, 3), (4, 8), False),           # Fortran order
    ((2, 3), (24, 4), False),          # padded rows
    ((1, 3), (999, 4), True),          # extent-1 dims: stride irrelevant
    ((2, 1), (4, 7), True),
    ((0, 3), (5, 5), True),            # size 0
    ((), (), True),                    # scalar
    ((3,), (-4,), False),              # reversed
    ((2, 3), (12,), False),            # malformed
])
def test_is_c_contiguous(shape, strides, expected):
    assert _da(shape, strides).is_c_contiguous is expected


def test_device_array_sizes_and_eq():
    a = _da((2, 3, 4), None, np.float16)
    assert a.size == 24 and a.itemsize == 2 and a.nbytes == 48
    assert _da((), None).size == 1
    assert _da((5, 0), None).nbytes == 0
    b = DeviceArray(ptr=PTR, shape=(2, 3, 4), dtype=np.dtype(np.float16), strides=None,
                    stream=None, readonly=False, library="cai", owner=object())
    assert a == b  # owner does not take part in comparisons
    with pytest.raises(AttributeError):
        a.ptr = 0  # frozen


# ---------------------------------------------------------------------------
# resolve_stream
# ---------------------------------------------------------------------------


class ProtoStream:
    def __init__(self, value):
        self.value = value

    def __cuda_stream__(self):
        return self.value


class ProtoStreamAttr:
    def __init__(self, value):
        self.__cuda_stream__ = value


@pytest.mark.parametrize("handle", [0, 1, 2, 0xABC000])
def test_stream_protocol_method(handle):
    assert resolve_stream(ProtoStream((0, handle))) == handle


def test_stream_protocol_attribute_tuple():
    assert resolve_stream(ProtoStreamAttr((0, 4242))) == 4242


@pytest.mark.parametrize("value,exc", [
    (4242, ArgumentTypeError), ((0,), ArgumentTypeError), ((0, "h"), ArgumentTypeError),
    ([0, 5], ArgumentTypeError), ((0, -5), ArgumentError),
])
def test_stream_protocol_bad_rejected(value, exc):
    with pytest.raises(exc, match="^stream: "):
        resolve_stream(ProtoStream(value))


def test_cupy_stream_object():
    class Stream:
        def __init__(self, ptr):
            self.ptr = ptr

    CupyStream = with_module(Stream, "cupy.cuda.stream")
    assert resolve_stream(CupyStream(555)) == 555
    assert resolve_stream(CupyStream(0)) == 0


def test_cupy_module_object_without_ptr_rejected():
    class NotAStream:
        pass

    with pytest.raises(ArgumentTypeError, match="^stream: expected a CUDA stream"):
        resolve_stream(with_module(NotAStream, "cupy.cuda")())


def test_ptr_attribute_outside_cupy_rejected():
    class HasPtr:
        ptr = 123

    with pytest.raises(ArgumentTypeError, match="^stream: "):
        resolve_stream(HasPtr())


def test_torch_stream_object():
    class Stream:
        cuda_stream = 777

    assert resolve_stream(with_module(Stream, "torch.cuda.streams")()) == 777


def test_torch_module_object_without_cuda_stream_rejected():
    class Stream:
        stream_id = 3

    with pytest.raises(ArgumentTypeError, match="^stream: "):
        resolve_stream(with_module(Stream, "torch")())


def test_numba_stream_object():
    class NumbaStream:
        def __init__(self, value):
            self.handle = ctypes.c_void_p(value)

    assert resolve_stream(NumbaStream(0x1234)) == 0x1234
    assert resolve_stream(NumbaStream(0)) == 0  # c_void_p(0).value is None
    assert resolve_stream(NumbaStream(2)) == 2


def test_numba_like_bad_handle_rejected():
    class Bad:
        handle = types.SimpleNamespace(value="x")

    with pytest.raises(ArgumentError, match="^stream: "):
        resolve_stream(Bad())


@pytest.mark.parametrize("value", [0, 1, 2, 0x7FFF_FFFF_FFFF, np.int64(9), np.uint64(11)])
def test_int_stream(value):
    assert resolve_stream(value) == int(value)
    assert type(resolve_stream(value)) is int


def test_negative_int_stream_rejected():
    with pytest.raises(ArgumentError, match="^stream: .*>= 0"):
        resolve_stream(-1)


@pytest.mark.parametrize("value", [True, False, np.bool_(True)])
def test_bool_stream_rejected(value):
    with pytest.raises(ArgumentTypeError, match="^stream: .*bool"):
        resolve_stream(value)


@pytest.mark.parametrize("value", ["0", 1.0, object(), [0]])
def test_other_stream_rejected(value):
    with pytest.raises(ArgumentTypeError, match="^stream: expected a CUDA stream"):
        resolve_stream(value)


def _array_from(library, stream=None):
    return DeviceArray(ptr=PTR, shape=(1,), dtype=np.dtype(np.float32), strides=None,
                       stream=stream, readonly=False, library=library, owner=None)


@pytest.fixture
def fake_frameworks(monkeypatch):
    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(
        get_current_stream=lambda: types.SimpleNamespace(ptr=1111))
    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(
        current_stream=lambda: types.SimpleNamespace(cuda_stream=2222))
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "torch", torch)


def test_none_stream_without_arrays_is_legacy_default():
    assert resolve_stream(None) == 0
    assert resolve_stream(None, [_array_from("cai"), _array_from("numba"),
                                 _array_from("jax"), _array_from("dlpack")]) == 0


def test_none_stream_uses_cupy_current(fake_frameworks):
    assert resolve_stream(None, [_array_from("cupy")]) == 1111


def test_none_stream_uses_torch_current(fake_frameworks):
    assert resolve_stream(None, [_array_from("torch")]) == 2222


def test_none_stream_first_library_wins(fake_frameworks):
    assert resolve_stream(None, [_array_from("torch"), _array_from("cupy")]) == 2222
    assert resolve_stream(None, [_array_from("cupy"), _array_from("torch")]) == 1111
    assert resolve_stream(None, [_array_from("cai"), _array_from("cupy")]) == 1111


def test_explicit_stream_ignores_arrays(fake_frameworks):
    assert resolve_stream(7, [_array_from("cupy")]) == 7


def test_import_has_no_framework_side_effects():
    code = ("import sys, ferrum_ffi._interop; "
            "bad = [m for m in ('cupy', 'torch', 'jax', 'numba') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=_repo_root())


def _repo_root():
    import pathlib

    return str(pathlib.Path(__file__).resolve().parents[1])


# ---------------------------------------------------------------------------
# producer_streams_to_wait
# ---------------------------------------------------------------------------


def test_producer_streams_to_wait():
    arrays = [_array_from("cai", s) for s in (None, 1, 5, 5, 2, None)]
    assert producer_streams_to_wait(arrays, 0) == [5, 2]
    assert producer_streams_to_wait(arrays, 1) == [5, 2]
    assert producer_streams_to_wait(arrays, 5) == [1, 2]
    assert producer_streams_to_wait(arrays, 2) == [1, 5]
    assert producer_streams_to_wait(arrays, 9) == [1, 5, 2]


def test_producer_streams_none_means_no_wait():
    assert producer_streams_to_wait([_array_from("dlpack"), _array_from("cai")], 3) == []
    assert producer_streams_to_wait([], 3) == []


def test_producer_streams_same_stream_no_wait():
    assert producer_streams_to_wait([_array_from("cai", 7)], 7) == []
    assert producer_streams_to_wait([_array_from("cai", 7)], 8) == [7]
