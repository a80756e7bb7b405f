"""The C ABI of libferrum_marlin.so against the header and ferrum_ffi._native.

Needs the built library (found through the normal loader: the installed
package, or FERRUM_MARLIN_LIBRARY); skipped cleanly only when it cannot be
found or is an installed build older than the header (its own copy of the
header lacks the functions it misses); any other missing export fails. No test here needs a GPU: the native argument checks run before any
device query, and on a machine without a GPU every entry point must answer a
staged status instead of crashing.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

import ferrum_ffi
from ferrum_ffi import _native
from ferrum_ffi._native import PROTOTYPES, NativeLibrary
from ferrum_ffi.status import STAGES, LibraryError, NativeError, StagedNativeStatus, _CUDA_ERROR_NAMES
from ferrum_ffi.validation import W4A16Problem

HEADER = Path(__file__).resolve().parents[1] / "native" / "include" / "ferrum_marlin.h"

# ---- parsing the header ------------------------------------------------------------


def _header_text(header: Path = HEADER) -> str:
    text = header.read_text()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def _header_defines() -> dict[str, int]:
    """Every integer #define: decimal or hex, with or without a u/l suffix."""
    pattern = r"^\s*#\s*define\s+(\w+)\s+(-?(?:0[xX][0-9a-fA-F]+|\d+))[uUlL]*\s*$"
    return {name: int(value, 0) for name, value in re.findall(pattern, _header_text(), flags=re.M)}


def _header_struct(name: str) -> list[tuple[str, str]]:
    """(C type, field name) of every field of ``typedef struct name {...} name;``."""
    match = re.search(rf"typedef\s+struct\s+{name}\s*\{{(.*?)\}}\s*{name}\s*;", _header_text(), flags=re.S)
    assert match, f"struct {name} not found in the header"
    fields = []
    for declaration in match.group(1).split(";"):
        declaration = " ".join(declaration.split())
        if declaration:
            ctype, field_name = re.fullmatch(r"(.+?)\s*\b(\w+)", declaration).groups()
            fields.append((ctype.strip(), field_name))
    return fields


def _parse_declarations(header: Path = HEADER) -> dict[str, tuple[str, list[str]]]:
    """name -> (return type, parameter declarations) of every FERRUM_API function."""
    code = "\n".join(line for line in _header_text(header).splitlines() if not line.lstrip().startswith("#"))
    declarations = {}
    pattern = re.compile(r"FERRUM_API\s+([\w\s\*]+?)\s*\b(\w+)\s*\(([^)]*)\)\s*;", re.S)
    for ret, name, params in pattern.findall(code):
        params = " ".join(params.split())
        args = [] if params in ("", "void") else [p.strip() for p in params.split(",")]
        assert name not in declarations, f"{name} declared twice"
        declarations[name] = (" ".join(ret.split()), args)
    return declarations


DECLARATIONS = _parse_declarations()


def _c_kind(declaration: str) -> str:
    """'pointer', 'size_t', 'int', 'float' or 'void' for a C return type or
    parameter declaration."""
    if "*" in declaration or "ferrum_stream_t" in declaration:
        return "pointer"
    words = declaration.replace("const", " ").split()
    if words and words[0] in ("size_t", "int", "float", "void"):
        return words[0]
    raise AssertionError(f"unexpected C type in {declaration!r}")


def _ctypes_kind(ctype: object) -> str:
    if ctype is ctypes.c_int:
        return "int"
    if ctype is ctypes.c_size_t:
        return "size_t"
    if ctype is ctypes.c_float:
        return "float"
    if ctype is None:
        return "void"
    if ctype in (ctypes.c_void_p, ctypes.c_char_p) or (
        isinstance(ctype, type) and issubclass(ctype, ctypes._Pointer)
    ):
        return "pointer"
    raise AssertionError(f"unexpected ctypes type {ctype!r}")


# ---- header <-> PROTOTYPES (pure text, no library) -----------------------------------


def test_header_parser_finds_the_declarations():
    assert len(DECLARATIONS) >= 15
    assert "marlin_cuda" in DECLARATIONS
    assert len(DECLARATIONS["marlin_cuda"][1]) == 16  # a multi-line declaration
    assert DECLARATIONS["ferrum_marlin_abi_version"] == ("int", [])
    assert DECLARATIONS["ferrum_marlin_build_info"][0] == "const char*"


def test_prototypes_and_header_name_the_same_functions_in_the_same_order():
    assert list(PROTOTYPES) == list(DECLARATIONS)


@pytest.mark.parametrize("name", sorted(DECLARATIONS))
def test_argument_count_and_kinds_match_the_header(name):
    ret, params = DECLARATIONS[name]
    restype, argtypes = PROTOTYPES[name]
    assert len(argtypes) == len(params), f"{name}: header has {len(params)} parameters"
    for index, (param, ctype) in enumerate(zip(params, argtypes)):
        assert _ctypes_kind(ctype) == _c_kind(param), f"{name} parameter {index}: {param!r} vs {ctype!r}"
    if "char" in ret:
        assert restype is ctypes.c_char_p, name
    else:
        assert _ctypes_kind(restype) == _c_kind(ret), name


def test_header_abi_version_matches_the_package():
    assert _header_defines()["FERRUM_MARLIN_ABI_VERSION"] == ferrum_ffi.ABI_VERSION == _native.ABI_VERSION


def test_header_stage_defines_match_the_python_stage_table():
    stages = {
        value: name[len("FERRUM_STAGE_"):].lower().replace("_", "-")
        for name, value in _header_defines().items()
        if name.startswith("FERRUM_STAGE_")
    }
    assert stages == dict(STAGES)


# ---- the general GEMM's struct and numbers (pure text, no library) --------------------

LAUNCH_FIELDS = _header_struct("FerrumMarlinLaunch")
ABI_DEFINE_PREFIXES = ("FERRUM_DTYPE_", "FERRUM_WEIGHT_", "FERRUM_MM_", "FERRUM_FP8_", "FERRUM_MOE_", "FERRUM_MAX_")


def _struct_ctype(declaration: str) -> object:
    """The ctypes type a header field type must map to."""
    if declaration == "ferrum_stream_t":
        return ctypes.c_void_p
    if declaration in ("const int*", "int*"):
        return ctypes.POINTER(ctypes.c_int)
    if declaration.endswith("void*"):
        return ctypes.c_void_p
    return {"unsigned int": ctypes.c_uint, "int": ctypes.c_int, "size_t": ctypes.c_size_t}[declaration]


def test_header_struct_parser_finds_the_launch_struct():
    assert LAUNCH_FIELDS[:2] == [("unsigned int", "abi_version"), ("unsigned int", "struct_size")]
    assert ("ferrum_stream_t", "stream") in LAUNCH_FIELDS
    assert len(LAUNCH_FIELDS) == 31


def test_launch_struct_fields_match_the_header_in_name_order_and_type():
    mirrored = [(name, ctype) for name, ctype in _native.FerrumMarlinLaunch._fields_]
    assert [name for name, _ in mirrored] == [name for _, name in LAUNCH_FIELDS]
    for (declaration, name), (_, ctype) in zip(LAUNCH_FIELDS, mirrored):
        assert ctype == _struct_ctype(declaration), f"{name}: header {declaration!r}, ctypes {ctype!r}"


def test_ferrum_marlin_mm_takes_a_pointer_to_the_struct():
    restype, argtypes = PROTOTYPES["ferrum_marlin_mm"]
    assert restype is ctypes.c_int
    assert argtypes == [ctypes.POINTER(_native.FerrumMarlinLaunch)]
    assert DECLARATIONS["ferrum_marlin_mm"] == ("int", ["const FerrumMarlinLaunch* launch"])


def test_every_abi_define_is_mirrored_once_in_python():
    from ferrum_ffi import _abi

    defines = {name: value for name, value in _header_defines().items() if name.startswith(ABI_DEFINE_PREFIXES)}
    assert len(defines) == 21, sorted(defines)
    for name, value in defines.items():
        assert getattr(_abi, name) == value, name
    python_names = {name for name in vars(_abi) if name.startswith(ABI_DEFINE_PREFIXES)}
    assert python_names == set(defines), "Python constants without a header define"


def test_enums_carry_the_header_numbers():
    from ferrum_ffi import _abi

    defines = _header_defines()
    for enum_type, prefix in ((_abi.ActivationType, "FERRUM_DTYPE_"), (_abi.WeightType, "FERRUM_WEIGHT_"),
                              (_abi.MmFlag, "FERRUM_MM_FLAG_")):
        members = {f"{prefix}{member.name}": int(member) for member in enum_type}
        # F32 is a dtype of the MoE ops only, not an activation type of a GEMM.
        expected = {name: value for name, value in defines.items()
                    if name.startswith(prefix) and name != "FERRUM_DTYPE_F32"}
        assert members == expected, enum_type
    assert _abi.MM_FLAGS_KNOWN == sum(int(flag) for flag in _abi.MmFlag)


def test_struct_offsets_and_size_match_a_c_compiler(tmp_path):
    """The strongest check: the C compiler's own offsetof/sizeof against ctypes."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    lines = [f'  printf("{name} %zu\\n", offsetof(FerrumMarlinLaunch, {name}));' for _, name in LAUNCH_FIELDS]
    source = tmp_path / "layout.c"
    source.write_text(
        "#include <stdio.h>\n#include <stddef.h>\n#include \"ferrum_marlin.h\"\n"
        "int main(void) {\n"
        + "\n".join(lines)
        + '\n  printf("sizeof %zu\\n", sizeof(FerrumMarlinLaunch));\n  return 0;\n}\n'
    )
    binary = tmp_path / "layout"
    subprocess.run([cc, "-std=c99", "-I", str(HEADER.parent), str(source), "-o", str(binary)], check=True)
    output = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout
    layout = dict(line.split() for line in output.splitlines())
    for name, _ in _native.FerrumMarlinLaunch._fields_:
        assert int(layout[name]) == getattr(_native.FerrumMarlinLaunch, name).offset, name
    assert int(layout["sizeof"]) == ctypes.sizeof(_native.FerrumMarlinLaunch)


# ---- the library -------------------------------------------------------------------


def _found_library() -> Path | None:
    """The file the loader would load, if there is one."""
    return next((path for path in _native._search_paths() if path.is_file()), None)


def _missing_exports(path: Path) -> set[str]:
    cdll = ctypes.CDLL(str(path))
    return {name for name in DECLARATIONS if not hasattr(cdll, name)}


def _predates_the_header(path: Path, missing: set[str]) -> bool:
    """True for a library built before ``missing`` entered the header: its own
    header, installed beside it (``include/ferrum_marlin.h``, as the wheel
    ships it), declares none of them. A library without its header beside it
    (a build folder) counts as built from this tree."""
    own = path.parent / "include" / "ferrum_marlin.h"
    return own.is_file() and not missing & set(_parse_declarations(own))


@pytest.fixture(scope="module")
def lib() -> NativeLibrary:
    """The loaded library. Skips when there is none, or when it is an older
    build that lacks newer functions; a library that lacks a function its own
    header declares fails every test that needs it."""
    try:
        return ferrum_ffi.library()
    except LibraryError as exc:
        path = _found_library()
        try:
            missing = _missing_exports(path) if path else set()
        except OSError:
            missing = set()  # not loadable at all: the loader tests cover that
        if missing and not _predates_the_header(path, missing):
            pytest.fail(f"{path} does not export {', '.join(sorted(missing))}, which the header declares: {exc}")
        state = "built from an older ferrum_marlin.h (rebuild it)" if missing else "not available"
        pytest.skip(f"libferrum_marlin.so {state}: {exc}")


def test_a_library_counts_as_stale_only_when_its_own_header_lacks_the_missing_functions(tmp_path):
    library_path = tmp_path / "libferrum_marlin.so"
    assert not _predates_the_header(library_path, {"ferrum_moe_sum"})  # no header beside it: strict
    own = tmp_path / "include" / "ferrum_marlin.h"
    own.parent.mkdir()
    own.write_text("FERRUM_API int ferrum_marlin_abi_version(void);\n")
    assert _predates_the_header(library_path, {"ferrum_moe_sum"})
    own.write_text(HEADER.read_text())  # built from this header, yet missing a function
    assert not _predates_the_header(library_path, {"ferrum_moe_sum"})


@pytest.fixture(scope="module")
def no_gpu(lib) -> None:
    if ferrum_ffi.device_count() > 0:
        pytest.skip("a CUDA device is visible; this test is about GPU-less machines")


def _defined_dynamic_symbols(path: Path) -> list[tuple[str, str]]:
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    output = subprocess.run([nm, "-D", "--defined-only", str(path)], check=True, capture_output=True, text=True)
    symbols = []
    for line in output.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            symbols.append((parts[-2], parts[-1].split("@")[0]))
    return symbols


def test_every_header_function_is_exported(lib):
    for name in DECLARATIONS:
        assert getattr(lib.cdll, name) is not None
    text_symbols = {name for kind, name in _defined_dynamic_symbols(lib.path) if kind in "TtWwi"}
    assert set(DECLARATIONS) <= text_symbols


def test_the_library_exports_nothing_else(lib):
    # 'A' entries are version nodes (GLIBC_x, ...), not symbols of the library.
    exported = {name for kind, name in _defined_dynamic_symbols(lib.path) if kind != "A"}
    assert exported - set(DECLARATIONS) == set(), "exported but not in the header"


def test_abi_version(lib):
    assert lib.abi_version == ferrum_ffi.ABI_VERSION
    assert lib.cdll.ferrum_marlin_abi_version() == _header_defines()["FERRUM_MARLIN_ABI_VERSION"]


def test_stage_names_match_python(lib):
    for stage in range(0, 11):
        name = lib.ferrum_marlin_status_stage_name(stage).decode()
        assert name == STAGES.get(stage, "unknown"), stage
    assert lib.ferrum_marlin_status_stage_name(-1).decode() == "unknown"


def test_build_info_names_version_abi_and_architectures(lib):
    info = lib.build_info
    assert "archs" in info
    assert re.search(r"\b\d{2,3}[a-f]?(-real|-virtual)?\b", info.split("archs", 1)[1]), info
    assert f"abi {ferrum_ffi.ABI_VERSION}" in info


def _cuda_error_name_cases():
    for code, name in _CUDA_ERROR_NAMES.items():
        yield pytest.param(code, name, id=f"{code}")


@pytest.mark.parametrize("code, name", list(_cuda_error_name_cases()))
def test_python_cuda_error_names_agree_with_the_runtime(lib, code, name):
    assert lib.ferrum_marlin_cuda_error_name(code).decode() == name


def test_last_error_is_a_string(lib):
    assert isinstance(lib.last_error(), str)


# ---- the loader ------------------------------------------------------------------


def test_missing_library_is_a_library_error_naming_the_path(monkeypatch, tmp_path):
    missing = tmp_path / "nowhere" / "libferrum_marlin.so"
    monkeypatch.setenv(_native.ENV_LIBRARY, str(missing))
    monkeypatch.setattr(_native, "_library", None)
    with pytest.raises(LibraryError, match=re.escape(str(missing))) as info:
        ferrum_ffi.library()
    assert _native.ENV_LIBRARY in str(info.value)
    assert _native._library is None


def test_unloadable_file_is_a_library_error(monkeypatch, tmp_path):
    bogus = tmp_path / "libferrum_marlin.so"
    bogus.write_text("not an ELF file")
    monkeypatch.setenv(_native.ENV_LIBRARY, str(bogus))
    monkeypatch.setattr(_native, "_library", None)
    with pytest.raises(LibraryError, match="cannot load"):
        ferrum_ffi.library()


def test_library_is_loaded_once(lib):
    assert ferrum_ffi.library() is ferrum_ffi.library()


def test_abi_mismatch_is_refused(lib, monkeypatch):
    monkeypatch.setattr(_native, "ABI_VERSION", 999)
    with pytest.raises(LibraryError) as info:
        NativeLibrary(lib.path)
    message = str(info.value)
    assert "999" in message
    assert f"ABI version {lib.abi_version}" in message
    assert str(lib.path) in message


def test_unknown_attribute_is_not_forwarded(lib):
    with pytest.raises(AttributeError):
        lib.not_a_symbol  # noqa: B018


# ---- marlin_cuda's own argument checks (before any device query) -------------------

GOOD = dict(
    A=0x1000, B=0x2000, C=0x3000, s=0x4000, prob_m=16, prob_n=256, prob_k=256, workspace=0x5000,
    groupsize=128, dev=0, stream=None, thread_k=-1, thread_n=-1, sms=-1, max_par=16, prob_n_full=-1,
)


def call_marlin(lib, **changes) -> tuple[StagedNativeStatus | None, str]:
    args = {**GOOD, **changes}
    code = lib.marlin_cuda(*args.values())
    return StagedNativeStatus.decode(code), lib.last_error()


def test_argument_table_follows_the_prototype():
    assert len(GOOD) == len(PROTOTYPES["marlin_cuda"][1])
    header_names = [p.replace("*", " ").split()[-1] for p in DECLARATIONS["marlin_cuda"][1]]
    assert header_names == list(GOOD)


def _expect(status: StagedNativeStatus | None, stage: int) -> None:
    assert status is not None
    assert status.stage == stage, status
    assert status.stage_name == STAGES[stage]
    assert status.cuda_status == _header_defines()["FERRUM_STATUS_INVALID_VALUE"]


def test_null_a_is_an_argument_error(lib):
    status, message = call_marlin(lib, A=None)
    _expect(status, 7)
    assert "A must not be null" in message


@pytest.mark.parametrize("name", ["B", "C", "s", "workspace"])
def test_each_null_pointer_is_named(lib, name):
    status, message = call_marlin(lib, **{name: None})
    _expect(status, 7)
    assert f"{name} must not be null" in message


def test_misaligned_b_is_an_argument_error(lib):
    status, message = call_marlin(lib, B=0x1008)
    _expect(status, 7)
    assert "B" in message and "16-byte" in message and "0x1008" in message


def test_workspace_needs_only_4_byte_alignment(lib):
    status, message = call_marlin(lib, workspace=0x5002)
    _expect(status, 7)
    assert "workspace" in message and "4-byte" in message


def test_prob_n_not_multiple_of_64_is_a_shape_error(lib):
    status, message = call_marlin(lib, prob_n=96)
    _expect(status, 8)
    assert "prob_n=96" in message and "64" in message


def test_prob_k_not_multiple_of_128_is_a_shape_error(lib):
    status, message = call_marlin(lib, prob_k=192)
    _expect(status, 8)
    assert "prob_k=192" in message and "128" in message


def test_groupsize_64_is_a_shape_error(lib):
    status, message = call_marlin(lib, groupsize=64)
    _expect(status, 8)
    assert "groupsize=64" in message


def test_unsupported_tile_is_a_shape_error(lib):
    status, message = call_marlin(lib, thread_k=64, thread_n=64)
    _expect(status, 8)
    assert "thread_k=64" in message and "thread_n=64" in message


def test_forced_tile_wider_than_n_is_a_shape_error(lib):
    status, message = call_marlin(lib, prob_n=128, thread_k=64, thread_n=256)
    _expect(status, 8)
    assert "tile width 256" in message


def test_n_full_smaller_than_n_is_a_shape_error(lib):
    status, message = call_marlin(lib, prob_n_full=128)
    _expect(status, 8)
    assert "prob_n_full=128" in message


def test_n_full_past_max_dim_is_a_shape_error(lib):
    status, message = call_marlin(lib, prob_n_full=2**28 + 64)
    _expect(status, 8)
    assert "prob_n_full=268435520" in message and "FERRUM_MAX_DIM" in message


def test_max_par_zero_is_an_argument_error(lib):
    status, message = call_marlin(lib, max_par=0)
    _expect(status, 7)
    assert "max_par=0" in message


@pytest.mark.parametrize(
    "changes, text",
    [({"prob_m": -1}, "prob_m=-1"), ({"prob_n": 0}, "prob_n=0"), ({"prob_k": 0}, "prob_k=0"),
     ({"sms": 0}, "sms=0"), ({"dev": -1}, "dev=-1")],
)
def test_other_argument_errors(lib, changes, text):
    status, message = call_marlin(lib, **changes)
    _expect(status, 7)
    assert text in message


def test_too_few_locks_for_the_column_tiles_is_a_shape_error(lib):
    # n=192 runs three 64-wide tiles, but max(1, 192/128) * max_par = 1 lock.
    status, message = call_marlin(lib, prob_n=192, max_par=1)
    _expect(status, 8)
    assert "raise max_par" in message


def test_prob_m_zero_is_a_no_op_even_with_null_pointers(lib):
    status, message = call_marlin(lib, A=None, B=None, C=None, s=None, workspace=None, prob_m=0)
    assert status is None
    assert message == ""


def test_a_success_clears_the_previous_error(lib):
    call_marlin(lib, A=None)
    assert lib.last_error()
    call_marlin(lib, prob_m=0)
    assert lib.last_error() == ""


def test_check_raises_native_error_with_the_native_detail(lib):
    code = lib.marlin_cuda(*{**GOOD, "prob_n": 96}.values())
    with pytest.raises(NativeError) as info:
        lib.check("marlin_cuda", code, {"n": 96})
    err = info.value
    assert (err.stage, err.stage_name, err.cuda_status) == (8, "shape", 1)
    assert err.cuda_status_name == "cudaErrorInvalidValue"
    assert "prob_n=96" in err.detail
    assert "n=96" in str(err)
    lib.check("marlin_cuda", 0)  # success: nothing raised


# ---- runtime helpers --------------------------------------------------------------


def test_memset_of_zero_bytes_is_a_no_op(lib):
    assert lib.ferrum_marlin_memset_async(None, 0, 0, None) == 0


def test_memset_of_null_is_an_argument_error(lib):
    status = StagedNativeStatus.decode(lib.ferrum_marlin_memset_async(None, 0, 16, None))
    assert (status.stage, status.stage_name) == (7, "argument")
    assert "ptr" in lib.last_error()


def test_null_out_pointers_are_argument_errors(lib):
    for call, name in (
        (lambda: lib.ferrum_marlin_device_count(None), "count"),
        (lambda: lib.ferrum_marlin_pointer_device(ctypes.c_void_p(0x1000), None), "dev"),
        (lambda: lib.ferrum_marlin_event_create(None), "event"),
        (lambda: lib.ferrum_marlin_event_record(None, None), "event"),
        (lambda: lib.ferrum_marlin_event_elapsed_ms(None, None, None), "start"),
    ):
        status = StagedNativeStatus.decode(call())
        assert status is not None and status.stage == 7, name
        assert name in lib.last_error()


def test_destroying_a_null_event_and_waiting_on_oneself_are_no_ops(lib):
    assert lib.ferrum_marlin_event_destroy(None) == 0
    assert lib.ferrum_marlin_stream_wait(None, None) == 0


def test_device_count_never_raises(lib):
    count = ferrum_ffi.device_count()
    assert isinstance(count, int) and count >= 0
    raw = ctypes.c_int(-7)
    code = lib.ferrum_marlin_device_count(ctypes.byref(raw))
    if code != 0:
        status = StagedNativeStatus.decode(code)
        assert (status.stage, status.stage_name) == (9, "device")
        assert raw.value == 0
        assert count == 0
        assert lib.last_error()
    else:
        assert raw.value == count


# ---- without a GPU: statuses, not crashes -----------------------------------------


def test_device_count_is_zero_without_a_gpu(lib, no_gpu):
    assert ferrum_ffi.device_count() == 0


def test_marlin_cuda_without_a_gpu_returns_a_staged_status(lib, no_gpu):
    status, message = call_marlin(lib)
    assert status is not None
    assert status.stage in (1, 9), status
    assert status.stage_name in ("sm-count", "device")
    assert status.cuda_status != 0
    assert status.cuda_status_name.startswith("cudaError")
    assert message
    assert status.cuda_status_name in message or lib.ferrum_marlin_cuda_error_name(status.cuda_status).decode() in message


def test_launch_marlin_cuda_without_a_gpu_raises_native_error(lib, no_gpu):
    problem = W4A16Problem(m=16, n=256, k=256, group_size=128)
    with pytest.raises(NativeError) as info:
        ferrum_ffi.launch_marlin_cuda(0x1000, 0x2000, 0x3000, 0x4000, problem, 0x5000)
    err = info.value
    assert err.entry_point == "marlin_cuda"
    assert err.stage in (1, 9)
    assert err.shape == {"m": 16, "n": 256, "k": 256, "group_size": 128}
    assert err.detail
    assert "marlin_cuda failed at stage" in str(err)


def test_runtime_helpers_without_a_gpu_return_staged_statuses(lib, no_gpu):
    name = ctypes.create_string_buffer(64)
    major, minor, sms, mem = ctypes.c_int(), ctypes.c_int(), ctypes.c_int(), ctypes.c_size_t()
    event = ctypes.c_void_p()
    dev = ctypes.c_int(-5)
    codes = {
        "device_info": lib.ferrum_marlin_device_info(
            0, name, len(name), ctypes.byref(major), ctypes.byref(minor), ctypes.byref(sms), ctypes.byref(mem)
        ),
        "pointer_device": lib.ferrum_marlin_pointer_device(ctypes.c_void_p(0x1000), ctypes.byref(dev)),
        "event_create": lib.ferrum_marlin_event_create(ctypes.byref(event)),
        "memset_async": lib.ferrum_marlin_memset_async(ctypes.c_void_p(0x1000), 0, 16, None),
    }
    for helper, code in codes.items():
        status = StagedNativeStatus.decode(code)
        assert status is not None, helper
        assert status.stage in STAGES, (helper, status)
        assert status.cuda_status != 0, helper
        assert lib.last_error(), helper


# ---- ferrum_marlin_mm's own checks (before any device query) ------------------------

from ferrum_ffi import _abi  # noqa: E402
from ferrum_ffi.mm import launch_marlin_mm  # noqa: E402
from ferrum_ffi.validation import MmProblem, validate_mm  # noqa: E402

MM_GOOD = dict(
    abi_version=_abi.FERRUM_MM_LAUNCH_VERSION, struct_size=ctypes.sizeof(_native.FerrumMarlinLaunch),
    a=0x1000, b=0x2000, c=0x3000, c_tmp=None, b_scales=0x4000, zero_points=None, g_idx=None, perm=None,
    a_tmp=None, workspace=0x5000, a_scales=None, bias=None, workspace_bytes=1 << 20, c_tmp_bytes=0,
    a_tmp_bytes=0, m=16, n=256, k=256, lda=256, num_groups=2, group_size=128, a_type=_abi.FERRUM_DTYPE_F16,
    b_type=_abi.FERRUM_WEIGHT_U4B8, device=0, sms=-1, stream=None,
    flags=_abi.FERRUM_MM_FLAG_K_FULL | _abi.FERRUM_MM_FLAG_ATOMIC_ADD, thread_k=-1, thread_n=-1,
)
_INT_P = ctypes.POINTER(ctypes.c_int)


def mm_struct(**changes) -> "_native.FerrumMarlinLaunch":
    launch = _native.FerrumMarlinLaunch()
    for name, value in {**MM_GOOD, **changes}.items():
        if name in ("g_idx", "perm") and value:
            value = ctypes.cast(ctypes.c_void_p(value), _INT_P)
        setattr(launch, name, value)
    return launch


def call_mm(lib, **changes) -> tuple[StagedNativeStatus | None, str]:
    code = lib.ferrum_marlin_mm(ctypes.byref(mm_struct(**changes)))
    return StagedNativeStatus.decode(code), lib.last_error()


def test_mm_table_names_every_struct_field():
    assert list(MM_GOOD) == [name for _, name in LAUNCH_FIELDS]


def test_mm_null_launch_is_an_argument_error(lib):
    status = StagedNativeStatus.decode(lib.ferrum_marlin_mm(None))
    _expect(status, 7)
    assert "launch" in lib.last_error()


def test_mm_unknown_abi_version_is_refused(lib):
    status, message = call_mm(lib, abi_version=_abi.FERRUM_MM_LAUNCH_VERSION + 1)
    _expect(status, 7)
    assert "abi_version" in message


def test_mm_too_small_struct_size_is_refused(lib):
    status, message = call_mm(lib, struct_size=ctypes.sizeof(_native.FerrumMarlinLaunch) - 4)
    _expect(status, 7)
    assert "struct_size" in message


def test_mm_m_zero_is_a_no_op_even_with_null_pointers(lib):
    status, message = call_mm(lib, m=0, a=None, b=None, c=None, b_scales=None, workspace=None)
    assert status is None and message == ""


def _problem_of(changes: dict) -> MmProblem:
    fields = {**MM_GOOD, **changes}
    return MmProblem(**{name: fields[name] for name in MmProblem.__dataclass_fields__})


# Struct changes that break one rule of the header each; Python and the library
# must both refuse them (the library before touching a device: stage 7 or 8).
MM_BAD = {
    "a_type": dict(a_type=3),
    "b_type": dict(b_type=9),
    "unknown_flag": dict(flags=MM_GOOD["flags"] | 0x40),
    "m": dict(m=-1),
    "n": dict(n=96),
    "k": dict(k=192, lda=192, num_groups=1, group_size=-1),
    "lda_small": dict(lda=248),
    "n_past_max_dim": dict(n=2**28 + 64),
    "lda_past_max_dim": dict(lda=2**28 + 8),
    "lda_odd": dict(lda=260),
    "group_size": dict(group_size=192, num_groups=1),
    "fp8_group_size": dict(b_type=_abi.FERRUM_WEIGHT_FE4M3FN, group_size=64, num_groups=4),
    "num_groups": dict(num_groups=3),
    "zero_point_flag": dict(flags=MM_GOOD["flags"] | _abi.FERRUM_MM_FLAG_HAS_ZERO_POINTS),
    "u4_without_flag": dict(b_type=_abi.FERRUM_WEIGHT_U4, zero_points=0x6000),
    "k_full_clear_without_act_order": dict(flags=_abi.FERRUM_MM_FLAG_ATOMIC_ADD),
    "k_shard_no_groups": dict(num_groups=0, g_idx=0x8000, perm=0x9000, a_tmp=0xA000, a_tmp_bytes=1 << 20,
                              flags=_abi.FERRUM_MM_FLAG_ATOMIC_ADD | _abi.FERRUM_MM_FLAG_ACT_ORDER),
    "k_shard_n_192": dict(n=192, num_groups=8, g_idx=0x8000, perm=0x9000, a_tmp=0xA000, a_tmp_bytes=1 << 20,
                          flags=_abi.FERRUM_MM_FLAG_ATOMIC_ADD | _abi.FERRUM_MM_FLAG_ACT_ORDER),
    "k_shard_tile": dict(thread_k=64, thread_n=256, num_groups=8, g_idx=0x8000, perm=0x9000, a_tmp=0xA000,
                         a_tmp_bytes=1 << 20, flags=_abi.FERRUM_MM_FLAG_ATOMIC_ADD | _abi.FERRUM_MM_FLAG_ACT_ORDER),
    "both_reductions": dict(flags=MM_GOOD["flags"] | _abi.FERRUM_MM_FLAG_FP32_REDUCE, c_tmp=0x7000, c_tmp_bytes=1 << 30),
    "act_order_fp8": dict(b_type=_abi.FERRUM_WEIGHT_FE4M3FN, g_idx=0x8000, perm=0x9000, a_tmp=0xA000,
                          a_tmp_bytes=1 << 20, flags=MM_GOOD["flags"] | _abi.FERRUM_MM_FLAG_ACT_ORDER),
    "act_order_channelwise": dict(group_size=-1, num_groups=1, g_idx=0x8000, perm=0x9000, a_tmp=0xA000,
                                  a_tmp_bytes=1 << 20, flags=MM_GOOD["flags"] | _abi.FERRUM_MM_FLAG_ACT_ORDER),
    "act_order_lda_zero": dict(lda=0, g_idx=0x8000, perm=0x9000, a_tmp=0xA000, a_tmp_bytes=1 << 20,
                               flags=MM_GOOD["flags"] | _abi.FERRUM_MM_FLAG_ACT_ORDER),
    "sms": dict(sms=0),
    "tile": dict(thread_k=64, thread_n=64),
    "deep_tile_tall": dict(thread_k=128, thread_n=256, m=17),
}


@pytest.mark.parametrize("case", sorted(MM_BAD))
def test_python_and_library_refuse_the_same_problems(lib, case):
    with pytest.raises((ferrum_ffi.ArgumentError, ferrum_ffi.ArgumentTypeError)):
        validate_mm(_problem_of(MM_BAD[case]))
    status, message = call_mm(lib, **MM_BAD[case])
    assert status is not None and status.stage in (7, 8), (case, status)
    assert message.startswith("ferrum_marlin_mm")


@pytest.mark.parametrize(
    "changes, text",
    [(dict(a_scales=0xB000), "a_scales"), (dict(c_tmp=0xB000), "c_tmp"), (dict(g_idx=0xB000), "g_idx"),
     (dict(b=0x2008), "b"), (dict(workspace=None), "workspace"), (dict(bias=0x1008), "bias")],
)
def test_mm_buffer_rules_are_refused_natively(lib, changes, text):
    status, message = call_mm(lib, **changes)
    assert status is not None and status.stage in (7, 8), status
    assert text in message


def test_mm_without_a_gpu_returns_a_staged_status(lib, no_gpu):
    status, message = call_mm(lib)
    assert status is not None and status.stage in (1, 9), status


def test_mm_act_order_activations_may_be_narrower_than_k(lib, no_gpu):
    # A padded K shard (from_gptq(k_full=False)): a is read only through perm.
    narrow = dict(lda=136, g_idx=0x8000, perm=0x9000, a_tmp=0xA000, a_tmp_bytes=1 << 20,
                  flags=MM_GOOD["flags"] | _abi.FERRUM_MM_FLAG_ACT_ORDER)
    validate_mm(_problem_of(narrow))
    status, message = call_mm(lib, **narrow)
    assert status is not None and status.stage in (1, 9), (status, message)  # past every argument rule
    assert message


def test_mm_k_shard_passes_every_argument_rule(lib, no_gpu):
    # K_FULL clear: the whole layer's 8 groups over a 256-row shard, each row's
    # group named by g_idx.
    shard = dict(num_groups=8, lda=200, g_idx=0x8000, perm=0x9000, a_tmp=0xA000, a_tmp_bytes=1 << 20,
                 flags=_abi.FERRUM_MM_FLAG_ATOMIC_ADD | _abi.FERRUM_MM_FLAG_ACT_ORDER)
    validate_mm(_problem_of(shard))
    status, message = call_mm(lib, **shard)
    assert status is not None and status.stage in (1, 9), (status, message)  # past every argument rule
    assert message


def test_launch_marlin_mm_without_a_gpu_raises_native_error(lib, no_gpu):
    problem = MmProblem.create(16, 256, 256, _abi.FERRUM_DTYPE_BF16, _abi.FERRUM_WEIGHT_U4B8, 128, sms=4)
    with pytest.raises(NativeError) as info:
        launch_marlin_mm(problem, a=0x1000, b=0x2000, c=0x3000, b_scales=0x4000,
                         workspace=0x5000, workspace_bytes=64)
    err = info.value
    assert err.entry_point == "ferrum_marlin_mm"
    assert err.stage in (1, 9)
    assert err.shape["b_type"] == "U4B8" and err.shape["a_type"] == "BF16"


# ---- the fused-MoE entry points' own checks (before any device query) ----------------

from ferrum_ffi.moe_validation import (  # noqa: E402
    MarlinMoeF16Launch,
    MarlinMoeMxfp4Bf16Launch,
    MoeF16WeightType,
)

MOE_F16_GOOD = dict(
    a=0x1000, b=0x2000, c=0x3000, c_tmp=None, b_scales=0x4000, b_zeros=None, workspace=0x5000,
    sorted_token_ids=0x6000, expert_ids=0x7000, num_tokens_past_padded=0x8000, topk_weights=None,
    moe_block_size=16, top_k=8, mul_topk_weights=0, is_ep=0, prob_m=4, prob_n=1024, prob_k=2048, group_size=128,
    has_zp=0, dev=0, stream=None, use_atomic_add=1, use_fp32_reduce=0,
)
MOE_MXFP4_GOOD = dict(
    a=0x1000, b=0x2000, c=0x3000, c_tmp=None, b_bias=0x4000, b_scales=0x5000, workspace=0x6000,
    sorted_token_ids=0x7000, expert_ids=0x8000, num_tokens_past_padded=0x9000, topk_weights=None,
    moe_block_size=16, top_k=2, mul_topk_weights=0, is_ep=0, prob_m=4, prob_n=512, prob_k=256, group_size=32,
    dev=0, stream=None, use_atomic_add=1, use_fp32_reduce=0,
)


def _header_parameter_names(name: str) -> list[str]:
    return [p.replace("*", " ").split()[-1] for p in DECLARATIONS[name][1]]


def test_moe_argument_tables_follow_the_header():
    for entry in ("ferrum_vllm_marlin_moe_f16", "ferrum_vllm_marlin_moe_fp8_f16"):
        assert _header_parameter_names(entry) == list(MOE_F16_GOOD)
    assert _header_parameter_names("ferrum_vllm_marlin_moe_mxfp4_bf16") == list(MOE_MXFP4_GOOD)


def _f16_launch(weight_type: MoeF16WeightType, args: dict) -> MarlinMoeF16Launch:
    """The Python record of a C argument list (0/None optional pointers absent)."""
    return MarlinMoeF16Launch(
        weight_type=weight_type, a=args["a"] or 0, b=args["b"] or 0, c=args["c"] or 0,
        scales=args["b_scales"] or 0, workspace=args["workspace"] or 0,
        sorted_token_ids=args["sorted_token_ids"] or 0, expert_ids=args["expert_ids"] or 0,
        num_tokens_past_padded=args["num_tokens_past_padded"] or 0, moe_block_size=args["moe_block_size"],
        top_k=args["top_k"], prob_m=args["prob_m"], prob_n=args["prob_n"], prob_k=args["prob_k"],
        group_size=args["group_size"], c_tmp=args["c_tmp"] or None, zero_points=args["b_zeros"] or None,
        topk_weights=args["topk_weights"] or None, mul_topk_weights=bool(args["mul_topk_weights"]),
        is_ep=bool(args["is_ep"]), has_zero_points=bool(args["has_zp"]), device_ordinal=args["dev"],
        use_atomic_add=bool(args["use_atomic_add"]), use_fp32_reduce=bool(args["use_fp32_reduce"]),
    )


def _mxfp4_launch(args: dict) -> MarlinMoeMxfp4Bf16Launch:
    return MarlinMoeMxfp4Bf16Launch(
        expert_count=4, a=args["a"] or 0, b=args["b"] or 0, c=args["c"] or 0, bias=args["b_bias"] or 0,
        scales=args["b_scales"] or 0, workspace=args["workspace"] or 0,
        sorted_token_ids=args["sorted_token_ids"] or 0, expert_ids=args["expert_ids"] or 0,
        num_tokens_past_padded=args["num_tokens_past_padded"] or 0, moe_block_size=args["moe_block_size"],
        top_k=args["top_k"], prob_m=args["prob_m"], prob_n=args["prob_n"], prob_k=args["prob_k"],
        group_size=args["group_size"], c_tmp=args["c_tmp"] or None, topk_weights=args["topk_weights"] or None,
        mul_topk_weights=bool(args["mul_topk_weights"]), is_ep=bool(args["is_ep"]), device_ordinal=args["dev"],
        use_atomic_add=bool(args["use_atomic_add"]), use_fp32_reduce=bool(args["use_fp32_reduce"]),
    )


# Multiples of 64 that no tile divides: the kernels run a partial last tile.
MOE_PARTIAL_TILES = (dict(prob_n=64, prob_k=64, group_size=-1), dict(prob_n=192, prob_k=320, group_size=-1),
                     dict(prob_n=2880, prob_k=2880, group_size=-1))


def test_moe_good_tables_pass_python():
    _f16_launch(MoeF16WeightType.U4B8, MOE_F16_GOOD).validate()
    _f16_launch(MoeF16WeightType.E4M3, MOE_F16_GOOD).validate()
    _mxfp4_launch(MOE_MXFP4_GOOD).validate()
    for shape in MOE_PARTIAL_TILES:
        _f16_launch(MoeF16WeightType.U4B8, {**MOE_F16_GOOD, **shape}).validate()
        _f16_launch(MoeF16WeightType.E4M3, {**MOE_F16_GOOD, **shape}).validate()
        _mxfp4_launch({**MOE_MXFP4_GOOD, **shape, "group_size": 32}).validate()


# C-argument changes that break one rule the header says the library checks itself.
MOE_SHARED_BAD = {
    "null_a": dict(a=None),
    "misaligned_b": dict(b=0x2008),
    "misaligned_workspace": dict(workspace=0x5002),
    "block_size": dict(moe_block_size=24),
    "top_k": dict(top_k=0),
    "rows_overflow": dict(prob_m=2**31 - 1),
    "prob_n": dict(prob_n=96),
    "mul_topk_without_weights": dict(mul_topk_weights=1),
    "both_reductions": dict(use_fp32_reduce=1, c_tmp=0xA000),
    "no_reduction": dict(use_atomic_add=0),
    "c_tmp_without_fp32_reduce": dict(c_tmp=0xA000),
}
MOE_F16_BAD = {
    **MOE_SHARED_BAD,
    "prob_k": dict(prob_k=96, group_size=-1),
    "int4_group_16": dict(group_size=16),
    "has_zp_without_zeros": dict(has_zp=1),
    "zeros_without_has_zp": dict(b_zeros=0x9000),
}
MOE_FP8_BAD = {**MOE_SHARED_BAD, "group_64": dict(group_size=64), "zero_points": dict(has_zp=1, b_zeros=0x9000)}
MOE_MXFP4_BAD = {
    **MOE_SHARED_BAD,
    "prob_k": dict(prob_n=64, prob_k=96),  # group 32 divides k; the kernels need k % 64
    "group_64": dict(group_size=64),
    "null_bias": dict(b_bias=None),
}


def _expect_refused(lib, entry: str, args: dict) -> None:
    status = StagedNativeStatus.decode(getattr(lib, entry)(*args.values()))
    assert status is not None and status.stage in (7, 8), (entry, status)
    assert lib.last_error()


@pytest.mark.parametrize("case", sorted(MOE_F16_BAD))
def test_python_and_library_refuse_the_same_int4_moe_launches(lib, case):
    args = {**MOE_F16_GOOD, **MOE_F16_BAD[case]}
    with pytest.raises((ferrum_ffi.ArgumentError, ferrum_ffi.ArgumentTypeError)):
        _f16_launch(MoeF16WeightType.U4B8, args).validate()
    _expect_refused(lib, "ferrum_vllm_marlin_moe_f16", args)


@pytest.mark.parametrize("case", sorted(MOE_FP8_BAD))
def test_python_and_library_refuse_the_same_fp8_moe_launches(lib, case):
    args = {**MOE_F16_GOOD, **MOE_FP8_BAD[case]}
    with pytest.raises((ferrum_ffi.ArgumentError, ferrum_ffi.ArgumentTypeError)):
        _f16_launch(MoeF16WeightType.E4M3, args).validate()
    _expect_refused(lib, "ferrum_vllm_marlin_moe_fp8_f16", args)


@pytest.mark.parametrize("case", sorted(MOE_MXFP4_BAD))
def test_python_and_library_refuse_the_same_mxfp4_moe_launches(lib, case):
    args = {**MOE_MXFP4_GOOD, **MOE_MXFP4_BAD[case]}
    with pytest.raises((ferrum_ffi.ArgumentError, ferrum_ffi.ArgumentTypeError)):
        _mxfp4_launch(args).validate()
    _expect_refused(lib, "ferrum_vllm_marlin_moe_mxfp4_bf16", args)


# ---- the MoE profile sink (host only) ---------------------------------------------------


def test_profile_sink_opens_its_file_and_clears(lib, tmp_path):
    path = tmp_path / "moe.jsonl"
    ferrum_ffi.configure_moe_profile_sink(path, commit_sha="abc", model="m", runtime_flags={"x": 1})
    try:
        assert lib.ferrum_vllm_marlin_moe_profile_enabled() == 1
        assert path.exists()
    finally:
        ferrum_ffi.configure_moe_profile_sink(None)
    assert lib.ferrum_vllm_marlin_moe_profile_enabled() == 0


def test_profile_sink_that_cannot_open_raises_with_the_native_reason(lib, tmp_path):
    with pytest.raises(ferrum_ffi.ProfileSinkError, match="stayed off") as info:
        ferrum_ffi.configure_moe_profile_sink(tmp_path / "no" / "such" / "dir" / "moe.jsonl")
    assert lib.ferrum_vllm_marlin_moe_profile_enabled() == 0
    assert not str(info.value).endswith("no reason given")


# The layer variants (_ex): the same checks plus add_rows_div / clear / clear_bytes.
MOE_LAYER_GOOD = dict(add_rows_div=0, clear=None, clear_bytes=0, routing_flags=0)
# Direct routing without the align step's two arrays.
_DIRECT = dict(routing_flags=_abi.FERRUM_MOE_ROUTING_DIRECT, moe_block_size=8, sorted_token_ids=None,
               num_tokens_past_padded=None)
MOE_LAYER_BAD = {
    "negative_div": dict(add_rows_div=-1),
    "div_with_fp32_reduce": dict(add_rows_div=1, use_atomic_add=0, use_fp32_reduce=1, c_tmp=0xA000),
    "div_not_dividing_rows": dict(add_rows_div=3),
    "clear_without_bytes": dict(clear=0xB0000),
    "bytes_without_clear": dict(clear_bytes=16),
    "bytes_not_16": dict(clear=0xB0000, clear_bytes=24),
    "misaligned_clear": dict(clear=0xB0008, clear_bytes=16),
    "direct_with_sorted_ids": {**_DIRECT, "sorted_token_ids": 0xC000},
    "direct_with_count": {**_DIRECT, "num_tokens_past_padded": 0xC000},
    "direct_block_16": {**_DIRECT, "moe_block_size": 16},
    "direct_null_experts": {**_DIRECT, "expert_ids": None},
    "aligned_null_sorted_ids": dict(sorted_token_ids=None),
    "settled_aligned_clear": dict(routing_flags=_abi.FERRUM_MOE_ROUTING_SETTLED, clear=0xB0000, clear_bytes=16),
}


def test_moe_layer_argument_tables_follow_the_header():
    for entry in ("ferrum_vllm_marlin_moe_f16_ex", "ferrum_vllm_marlin_moe_fp8_f16_ex"):
        assert _header_parameter_names(entry) == list(MOE_F16_GOOD) + list(MOE_LAYER_GOOD)
    assert _header_parameter_names("ferrum_vllm_marlin_moe_mxfp4_bf16_ex") == (
        list(MOE_MXFP4_GOOD) + list(MOE_LAYER_GOOD))


def _with_layer(launch, args: dict):
    flags = args["routing_flags"]
    direct = bool(flags & _abi.FERRUM_MOE_ROUTING_DIRECT)
    # Direct routing's absent arrays are None (the records' "absent"), not null.
    aligned = {name: args[name] or None for name in ("sorted_token_ids", "num_tokens_past_padded")} if direct else {}
    return replace(launch, add_rows_div=args["add_rows_div"], clear=args["clear"] or None,
                   clear_bytes=args["clear_bytes"], routing_settled=bool(flags & _abi.FERRUM_MOE_ROUTING_SETTLED),
                   direct_routing=direct, **aligned)


@pytest.mark.parametrize("case", sorted(MOE_LAYER_BAD))
@pytest.mark.parametrize("entry", ["ferrum_vllm_marlin_moe_f16_ex", "ferrum_vllm_marlin_moe_mxfp4_bf16_ex"])
def test_python_and_library_refuse_the_same_layer_launches(lib, case, entry):
    mxfp4 = "mxfp4" in entry
    args = {**(MOE_MXFP4_GOOD if mxfp4 else MOE_F16_GOOD), **MOE_LAYER_GOOD, **MOE_LAYER_BAD[case]}
    launch = _mxfp4_launch(args) if mxfp4 else _f16_launch(MoeF16WeightType.U4B8, args)
    with pytest.raises((ferrum_ffi.ArgumentError, ferrum_ffi.ArgumentTypeError)):
        _with_layer(launch, args).validate()
    _expect_refused(lib, entry, args)


# Valid layer launches: rows added, a clear, direct routing (no align arrays), and
# direct routing settled with a clear (done after the last stage).
LAYER_VALID = {
    "adds_and_clear": dict(add_rows_div=2, clear=0xB0000, clear_bytes=64, routing_flags=0),
    "direct": {**MOE_LAYER_GOOD, **_DIRECT},
    "direct_settled_clear": {**_DIRECT, "add_rows_div": 2, "clear": 0xB0000, "clear_bytes": 64,
                             "routing_flags": _abi.FERRUM_MOE_ROUTING_SETTLED | _abi.FERRUM_MOE_ROUTING_DIRECT},
}


@pytest.mark.parametrize("case", sorted(LAYER_VALID))
@pytest.mark.parametrize("entry", ["ferrum_vllm_marlin_moe_f16_ex", "ferrum_vllm_marlin_moe_mxfp4_bf16_ex"])
def test_valid_layer_arguments_pass_python_and_reach_the_device_query(lib, no_gpu, entry, case):
    mxfp4 = "mxfp4" in entry
    args = {**(MOE_MXFP4_GOOD if mxfp4 else MOE_F16_GOOD), **LAYER_VALID[case]}
    args = {name: args[name] for name in list(MOE_MXFP4_GOOD if mxfp4 else MOE_F16_GOOD) + list(MOE_LAYER_GOOD)}
    launch = _mxfp4_launch(args) if mxfp4 else _f16_launch(MoeF16WeightType.U4B8, args)
    assert _with_layer(launch, args).entry_point == entry
    _with_layer(launch, args).validate()
    status = StagedNativeStatus.decode(getattr(lib, entry)(*args.values()))
    assert status is not None and status.stage not in (7, 8), status  # past every argument rule


ALIGN_GOOD = dict(topk_ids=0x1000, num_tokens=4, top_k=2, num_experts=8, block_size=16, expert_map=None,
                  sorted_token_ids=0x2000, sorted_capacity=4 * 2 + 8 * 15, expert_ids=0x3000,
                  expert_ids_capacity=9, num_tokens_post_padded=0x4000, dev=0, stream=None)


def test_align_argument_tables_follow_the_header():
    assert _header_parameter_names("ferrum_moe_align_block_size") == list(ALIGN_GOOD)
    assert _header_parameter_names("ferrum_moe_align_block_size_ex") == list(ALIGN_GOOD) + ["clear", "clear_bytes"]


@pytest.mark.parametrize("clear, clear_bytes", [(0x5000, 0), (None, 16), (0x5008, 16), (0x5000, 24)])
def test_the_library_refuses_a_bad_align_clear(lib, clear, clear_bytes):
    _expect_refused(lib, "ferrum_moe_align_block_size_ex", {**ALIGN_GOOD, "clear": clear, "clear_bytes": clear_bytes})


@pytest.mark.parametrize("flags", [4, -1, 1 << 16])
@pytest.mark.parametrize("entry", ["ferrum_vllm_marlin_moe_f16_ex", "ferrum_vllm_marlin_moe_mxfp4_bf16_ex"])
def test_the_library_refuses_unknown_routing_flags(lib, entry, flags):
    base = MOE_MXFP4_GOOD if "mxfp4" in entry else MOE_F16_GOOD
    _expect_refused(lib, entry, {**base, **MOE_LAYER_GOOD, "routing_flags": flags})
