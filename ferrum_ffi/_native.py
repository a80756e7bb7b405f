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
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .status import LibraryError, NativeError, StagedNativeStatus

ABI_VERSION = 2
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

# The INT4 and FP8 fused-MoE entry points share one signature.
_VLLM_MOE_F16_ARGS: list[object] = [
    ctypes.c_void_p,  # a
    ctypes.c_void_p,  # b
    ctypes.c_void_p,  # c
    ctypes.c_void_p,  # c_tmp
    ctypes.c_void_p,  # b_scales
    ctypes.c_void_p,  # b_zeros
    ctypes.c_void_p,  # workspace
    ctypes.c_void_p,  # sorted_token_ids
    ctypes.c_void_p,  # expert_ids
    ctypes.c_void_p,  # num_tokens_past_padded
    ctypes.c_void_p,  # topk_weights
    ctypes.c_int,  # moe_block_size
    ctypes.c_int,  # top_k
    ctypes.c_int,  # mul_topk_weights
    ctypes.c_int,  # is_ep
    ctypes.c_int,  # prob_m
    ctypes.c_int,  # prob_n
    ctypes.c_int,  # prob_k
    ctypes.c_int,  # group_size
    ctypes.c_int,  # has_zp
    ctypes.c_int,  # dev
    _stream,  # stream
    ctypes.c_int,  # use_atomic_add
    ctypes.c_int,  # use_fp32_reduce
]

# The MXFP4 x BF16 entry point: b_bias in b_zeros' place (both pointers), no has_zp.
_VLLM_MOE_MXFP4_ARGS: list[object] = _VLLM_MOE_F16_ARGS[:19] + _VLLM_MOE_F16_ARGS[20:]

# What the _ex variants of the fused-MoE GEMMs add to those.
_MOE_LAYER_ARGS: list[object] = [
    ctypes.c_int,  # add_rows_div
    ctypes.c_void_p,  # clear
    ctypes.c_size_t,  # clear_bytes
    ctypes.c_int,  # routing_flags (FERRUM_MOE_ROUTING_*)
]

_ALIGN_ARGS: list[object] = [
    ctypes.c_void_p,  # topk_ids
    ctypes.c_int,  # num_tokens
    ctypes.c_int,  # top_k
    ctypes.c_int,  # num_experts
    ctypes.c_int,  # block_size
    ctypes.c_void_p,  # expert_map
    ctypes.c_void_p,  # sorted_token_ids
    ctypes.c_int,  # sorted_capacity
    ctypes.c_void_p,  # expert_ids
    ctypes.c_int,  # expert_ids_capacity
    ctypes.c_void_p,  # num_tokens_post_padded
    ctypes.c_int,  # dev
    _stream,  # stream
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
    # ---- fused-MoE Marlin GEMMs. Device arrays typed int* / float* in the header
    # are c_void_p here so that integer device addresses pass as they are.
    "ferrum_vllm_marlin_moe_f16": (ctypes.c_int, _VLLM_MOE_F16_ARGS),
    "ferrum_vllm_marlin_moe_fp8_f16": (ctypes.c_int, _VLLM_MOE_F16_ARGS),
    "ferrum_vllm_marlin_moe_mxfp4_bf16": (ctypes.c_int, _VLLM_MOE_MXFP4_ARGS),
    # The layer variants: the same arguments, then add_rows_div, clear, clear_bytes, routing_flags.
    "ferrum_vllm_marlin_moe_f16_ex": (ctypes.c_int, _VLLM_MOE_F16_ARGS + _MOE_LAYER_ARGS),
    "ferrum_vllm_marlin_moe_fp8_f16_ex": (ctypes.c_int, _VLLM_MOE_F16_ARGS + _MOE_LAYER_ARGS),
    "ferrum_vllm_marlin_moe_mxfp4_bf16_ex": (ctypes.c_int, _VLLM_MOE_MXFP4_ARGS + _MOE_LAYER_ARGS),
    "ferrum_vllm_marlin_moe_set_profile_config": (
        None,
        [
            ctypes.c_char_p,  # path
            ctypes.c_char_p,  # commit_sha
            ctypes.c_char_p,  # env_hash
            ctypes.c_char_p,  # model
            ctypes.c_int,  # concurrency
            ctypes.c_char_p,  # runtime_flags_json
        ],
    ),
    "ferrum_vllm_marlin_moe_clear_profile_config": (None, []),
    "ferrum_vllm_marlin_moe_profile_enabled": (ctypes.c_int, []),
    "marlin_cuda_moe": (
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
            ctypes.c_void_p,  # a_row_offsets
            ctypes.c_void_p,  # tokens_per_expert
            ctypes.c_void_p,  # active_expert_ids
            ctypes.c_int,  # expert_count
            ctypes.c_int,  # b_int4_per_expert
            ctypes.c_int,  # s_int4_per_expert
            ctypes.c_int,  # locks_i32_per_expert
            ctypes.c_int,  # groupsize
            ctypes.c_int,  # dev
            _stream,  # stream
            ctypes.c_int,  # thread_k
            ctypes.c_int,  # thread_n
            ctypes.c_int,  # sms
            ctypes.c_int,  # prob_n_full
        ],
    ),
    # ---- MoE routing and the small ops of a MoE layer
    "ferrum_moe_align_block_size": (ctypes.c_int, _ALIGN_ARGS),
    "ferrum_moe_align_block_size_ex": (
        ctypes.c_int,
        _ALIGN_ARGS + [ctypes.c_void_p, ctypes.c_size_t],  # clear, clear_bytes
    ),
    "ferrum_topk_softmax": (
        ctypes.c_int,
        [
            ctypes.c_void_p,  # logits
            ctypes.c_int,  # dtype
            ctypes.c_int,  # num_tokens
            ctypes.c_int,  # num_experts
            ctypes.c_int,  # top_k
            ctypes.c_int,  # renormalize
            ctypes.c_void_p,  # topk_weights
            ctypes.c_void_p,  # topk_ids
            ctypes.c_int,  # dev
            _stream,  # stream
        ],
    ),
    "ferrum_silu_and_mul": (
        ctypes.c_int,
        [
            ctypes.c_void_p,  # x
            ctypes.c_void_p,  # out
            ctypes.c_int,  # rows
            ctypes.c_int,  # d
            ctypes.c_int,  # dtype
            ctypes.c_int,  # dev
            _stream,  # stream
        ],
    ),
    "ferrum_gpt_oss_swiglu": (
        ctypes.c_int,
        [
            ctypes.c_void_p,  # x
            ctypes.c_void_p,  # out
            ctypes.c_int,  # rows
            ctypes.c_int,  # logical_d
            ctypes.c_int,  # physical_d
            ctypes.c_float,  # alpha
            ctypes.c_float,  # limit
            ctypes.c_int,  # dtype
            ctypes.c_int,  # dev
            _stream,  # stream
        ],
    ),
    "ferrum_moe_sum": (
        ctypes.c_int,
        [
            ctypes.c_void_p,  # x
            ctypes.c_void_p,  # out
            ctypes.c_int,  # tokens
            ctypes.c_int,  # top_k
            ctypes.c_int,  # d
            ctypes.c_int,  # dtype
            ctypes.c_int,  # dev
            _stream,  # stream
        ],
    ),
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


@dataclass(frozen=True)
class NativeCall:
    """One native call whose every rule has passed: the entry point, its
    arguments in prototype order, and the shape a :class:`NativeError`
    reports. The launchers build it after their checks; running it checks
    nothing again (``fused_moe`` keeps the calls of a validated layer)."""

    entry: str
    args: tuple
    shape: dict | None = None

    def run(self, lib: NativeLibrary) -> None:
        lib.check(self.entry, getattr(lib, self.entry)(*self.args), self.shape)


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
