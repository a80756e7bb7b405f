"""Finding, loading and describing ``libferrum_marlin.so``.

One prototype per exported symbol, in the order of
``native/include/ferrum_marlin.h`` (tests/test_abi.py checks that the two agree
both ways). The library is loaded lazily, on the first call that needs it, so
that the pure-Python parts of the package (formats, validation) import on any
machine.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.resources
import os
import threading
from pathlib import Path
from typing import Iterator

from .status import LibraryError, NativeError, StagedNativeStatus

ABI_VERSION = 1
LIBRARY_NAME = "libferrum_marlin.so"
ENV_LIBRARY = "FERRUM_MARLIN_LIBRARY"

_c_int_p = ctypes.POINTER(ctypes.c_int)
_c_size_p = ctypes.POINTER(ctypes.c_size_t)
_c_float_p = ctypes.POINTER(ctypes.c_float)
_stream = ctypes.c_void_p  # cudaStream_t


class FerrumMarlinLaunch(ctypes.Structure):
    """``FerrumMarlinLaunch`` of the header, field by field in the same order and
    C types (tests/test_abi.py compares names, order, kinds and, with a C
    compiler at hand, every offset). ``struct_size`` lets the library accept
    callers built against an older, shorter version of the struct."""

    _fields_ = [
        ("abi_version", ctypes.c_uint),
        ("struct_size", ctypes.c_uint),
        # buffers
        ("a", ctypes.c_void_p),
        ("b", ctypes.c_void_p),
        ("c", ctypes.c_void_p),
        ("c_tmp", ctypes.c_void_p),
        ("b_scales", ctypes.c_void_p),
        ("zero_points", ctypes.c_void_p),
        ("g_idx", _c_int_p),
        ("perm", _c_int_p),
        ("a_tmp", ctypes.c_void_p),
        ("workspace", ctypes.c_void_p),
        ("a_scales", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_size_t),
        ("c_tmp_bytes", ctypes.c_size_t),
        ("a_tmp_bytes", ctypes.c_size_t),
        # problem
        ("m", ctypes.c_int),
        ("n", ctypes.c_int),
        ("k", ctypes.c_int),
        ("lda", ctypes.c_int),
        ("num_groups", ctypes.c_int),
        ("group_size", ctypes.c_int),
        # types
        ("a_type", ctypes.c_int),
        ("b_type", ctypes.c_int),
        # execution
        ("device", ctypes.c_int),
        ("sms", ctypes.c_int),
        ("stream", _stream),
        ("flags", ctypes.c_uint),
        ("thread_k", ctypes.c_int),
        ("thread_n", ctypes.c_int),
    ]

# name -> (restype, argtypes), mirroring the header line by line.
PROTOTYPES: dict[str, tuple[object, list[object]]] = {
    "ferrum_marlin_abi_version": (ctypes.c_int, []),
    "ferrum_marlin_build_info": (ctypes.c_char_p, []),
    "ferrum_marlin_status_stage_name": (ctypes.c_char_p, [ctypes.c_int]),
    "ferrum_marlin_last_error": (ctypes.c_char_p, []),
    "ferrum_marlin_cuda_error_name": (ctypes.c_char_p, [ctypes.c_int]),
    "ferrum_marlin_device_count": (ctypes.c_int, [_c_int_p]),
    "ferrum_marlin_device_info": (
        ctypes.c_int,
        [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, _c_int_p, _c_int_p, _c_int_p, _c_size_p],
    ),
    "ferrum_marlin_pointer_device": (ctypes.c_int, [ctypes.c_void_p, _c_int_p]),
    "ferrum_marlin_memset_async": (
        ctypes.c_int,
        [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, _stream],
    ),
    "ferrum_marlin_stream_wait": (ctypes.c_int, [_stream, _stream]),
    "ferrum_marlin_event_create": (ctypes.c_int, [ctypes.POINTER(ctypes.c_void_p)]),
    "ferrum_marlin_event_record": (ctypes.c_int, [ctypes.c_void_p, _stream]),
    "ferrum_marlin_event_elapsed_ms": (
        ctypes.c_int,
        [ctypes.c_void_p, ctypes.c_void_p, _c_float_p],
    ),
    "ferrum_marlin_event_destroy": (ctypes.c_int, [ctypes.c_void_p]),
    "marlin_cuda": (
        ctypes.c_int,
        [
            ctypes.c_void_p,  # A
            ctypes.c_void_p,  # B
            ctypes.c_void_p,  # C
            ctypes.c_void_p,  # s
            ctypes.c_int,  # prob_m
            ctypes.c_int,  # prob_n
            ctypes.c_int,  # prob_k
            ctypes.c_void_p,  # workspace
            ctypes.c_int,  # groupsize
            ctypes.c_int,  # dev
            _stream,  # stream
            ctypes.c_int,  # thread_k
            ctypes.c_int,  # thread_n
            ctypes.c_int,  # sms
            ctypes.c_int,  # max_par
            ctypes.c_int,  # prob_n_full
        ],
    ),
    "ferrum_marlin_mm": (ctypes.c_int, [ctypes.POINTER(FerrumMarlinLaunch)]),
}


def _candidates() -> Iterator[Path]:
    """Where the library may be, most specific first."""
    override = os.environ.get(ENV_LIBRARY)
    if override:
        yield Path(override)
        return
    try:
        yield Path(str(importlib.resources.files("ferrum_ffi").joinpath(LIBRARY_NAME)))
    except (ModuleNotFoundError, TypeError):
        pass
    # Editable installs serve the Python files from the source tree while the
    # built library lives in site-packages: the distribution's RECORD knows it.
    try:
        for entry in importlib.metadata.files("ferrum_ffi") or ():
            if entry.name == LIBRARY_NAME:
                yield Path(str(entry.locate()))
    except importlib.metadata.PackageNotFoundError:
        pass


def _search_paths() -> list[Path]:
    from . import __path__ as package_path  # the package's own folders

    paths = list(_candidates())
    if not os.environ.get(ENV_LIBRARY):
        paths.extend(Path(folder) / LIBRARY_NAME for folder in package_path)
    seen: set[str] = set()
    unique = []
    for path in paths:
        if str(path) not in seen:
            seen.add(str(path))
            unique.append(path)
    return unique


class NativeLibrary:
    """The loaded library: prototyped functions plus status handling."""

    def __init__(self, path: Path) -> None:
        try:
            self.cdll = ctypes.CDLL(str(path))
        except OSError as exc:
            raise LibraryError(f"cannot load {path}: {exc}") from exc
        self.path = path
        for name, (restype, argtypes) in PROTOTYPES.items():
            try:
                function = getattr(self.cdll, name)
            except AttributeError as exc:
                raise LibraryError(f"{path} does not export {name}; rebuild the library") from exc
            function.restype = restype
            function.argtypes = argtypes
        version = self.cdll.ferrum_marlin_abi_version()
        if version != ABI_VERSION:
            raise LibraryError(
                f"{path} has ABI version {version}, this ferrum_ffi needs {ABI_VERSION}; "
                "reinstall the package or point FERRUM_MARLIN_LIBRARY at a matching build"
            )
        self.abi_version = version

    def __getattr__(self, name: str):
        if name in PROTOTYPES:
            return getattr(self.cdll, name)
        raise AttributeError(name)

    @property
    def build_info(self) -> str:
        return self.cdll.ferrum_marlin_build_info().decode()

    def last_error(self) -> str:
        return (self.cdll.ferrum_marlin_last_error() or b"").decode(errors="replace")

    def check(self, entry_point: str, code: int, shape: dict | None = None) -> None:
        """Raise :class:`NativeError` for a failure status, with the native detail."""
        status = StagedNativeStatus.decode(code)
        if status is None:
            return
        name = self.cdll.ferrum_marlin_cuda_error_name(status.cuda_status)
        # The runtime answers "unrecognized error code" for numbers it does not
        # know; the Python table's cudaError<N> says more.
        if name and name.startswith(b"cuda"):
            status = StagedNativeStatus(
                code=status.code,
                stage=status.stage,
                stage_name=status.stage_name,
                cuda_status=status.cuda_status,
                cuda_status_name=name.decode(),
            )
        raise NativeError(entry_point, status, shape, self.last_error())


_lock = threading.Lock()
_library: NativeLibrary | None = None


def library() -> NativeLibrary:
    """The process-wide library, loaded on first use."""
    global _library
    if _library is not None:
        return _library
    with _lock:
        if _library is None:
            tried = []
            for path in _search_paths():
                if path.is_file():
                    _library = NativeLibrary(path)
                    break
                tried.append(str(path))
            else:
                raise LibraryError(
                    f"{LIBRARY_NAME} not found (looked in: {', '.join(tried) or 'nowhere'}); "
                    f"install ferrum_ffi with pip or set {ENV_LIBRARY}"
                )
    return _library


def device_count() -> int:
    """Number of CUDA devices the library sees; 0 without a driver or device."""
    count = ctypes.c_int(0)
    if library().ferrum_marlin_device_count(ctypes.byref(count)) != 0:
        return 0
    return count.value
