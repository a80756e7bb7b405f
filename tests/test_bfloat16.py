"""How bfloat16 device arrays are recognised: ``bfloat16_view`` over uint16
storage (any CuPy), and arrays that declare ``dtype`` bfloat16 themselves
behind the CAI's opaque ``'<V2'`` typestr (CuPy >= 14 with ml_dtypes)."""

from __future__ import annotations

import numpy as np
import pytest

from ferrum_ffi._interop import as_device_array, bfloat16_view
from ferrum_ffi.status import ArgumentError, ArgumentTypeError

BF16 = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)


class CAI:
    def __init__(self, shape, typestr, dtype=None, ptr=0x100000):
        self.__cuda_array_interface__ = {
            "version": 3, "shape": shape, "typestr": typestr, "data": (ptr, False), "strides": None,
        }
        if dtype is not None:
            self.dtype = dtype


def test_a_bfloat16_view_of_uint16_storage():
    storage = CAI((4, 256), "<u2")
    view = bfloat16_view(storage)
    array = as_device_array(view, "x")
    assert array.dtype == BF16 and array.shape == (4, 256)
    assert array.ptr == 0x100000
    assert view.base is storage and view.shape == (4, 256) and view.dtype == BF16
    assert view.__cuda_array_interface__["typestr"] == "<V2"


def test_a_bfloat16_view_needs_2_byte_cuda_storage():
    with pytest.raises(ArgumentTypeError, match=r"2-byte elements"):
        bfloat16_view(CAI((4, 256), "<f4"))
    with pytest.raises(ArgumentTypeError, match=r"__cuda_array_interface__"):
        bfloat16_view(np.zeros(4, np.uint16))


def test_arrays_that_declare_bfloat16_are_read_as_bfloat16():
    assert as_device_array(CAI((2, 64), "<V2", dtype=BF16), "x").dtype == BF16


def test_an_opaque_array_without_a_declared_dtype_is_still_refused():
    with pytest.raises(ArgumentError, match=r"opaque void type"):
        as_device_array(CAI((2, 64), "<V2"), "x")  # no declared dtype, no DLPack
    with pytest.raises(ArgumentError, match=r"opaque void type"):
        as_device_array(CAI((2, 64), "<V2", dtype=np.dtype("V2")), "x")
