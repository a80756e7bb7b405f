"""Runtime configuration, profiling counters and shape tracing (CPU only)."""

from __future__ import annotations


import pytest

from ferrum_ffi import profile
from ferrum_ffi.profile import (
    BUCKETS,
    NO_LABEL,
    PhaseStats,
    RuntimeConfig,
    bucket_from_label,
    current_label,
    drain_profile,
    profile_label,
    record,
    record_gather,
    trace_shape,
)

ALL_ON = {
    "FERRUM_MARLIN_PROFILE": "1",
    "FERRUM_MARLIN_SKIP_WS_ZERO": "1",
    "FERRUM_MARLIN_TRACE_SHAPES": "1",
    "FERRUM_MARLIN_TRACE_SHAPES_MAX": "17",
}
ENV_NAMES = tuple(ALL_ON)

# ---- RuntimeConfig.from_env (the seeds' cases) -------------------------------------


def test_from_env_parses_every_flag():  # cuda_marlin_runtime_config_parses_skip_ws_zero
    config = RuntimeConfig.from_env(ALL_ON)
    assert config.profile
    assert config.skip_ws_zero
    assert config.trace_shapes
    assert config.trace_shapes_max == 17
    assert not config.zero_workspace


def test_from_env_only_1_is_on():  # cuda_marlin_runtime_config_defaults_to_zero_workspace
    config = RuntimeConfig.from_env(
        {
            "FERRUM_MARLIN_PROFILE": "true",
            "FERRUM_MARLIN_SKIP_WS_ZERO": "true",
            "FERRUM_MARLIN_TRACE_SHAPES": "true",
            "FERRUM_MARLIN_TRACE_SHAPES_MAX": "not-a-number",
        }
    )
    assert not config.profile
    assert not config.skip_ws_zero
    assert not config.trace_shapes
    assert config.trace_shapes_max == 256


def test_workspace_zeroing_follows_the_config():  # marlin_workspace_zeroing_follows_runtime_config
    default = RuntimeConfig.from_env({})
    assert default == RuntimeConfig()
    assert default.zero_workspace
    assert (default.profile, default.skip_ws_zero, default.trace_shapes, default.trace_shapes_max) == (
        False,
        False,
        False,
        256,
    )
    assert not RuntimeConfig.from_env({"FERRUM_MARLIN_SKIP_WS_ZERO": "1"}).zero_workspace


@pytest.mark.parametrize("value", ["0", "", "yes", "on", "TRUE", " 1", "1 ", "01", "2"])
@pytest.mark.parametrize("name", ENV_NAMES[:3])
def test_flags_other_than_1_are_off(name, value):
    config = RuntimeConfig.from_env({name: value})
    assert config == RuntimeConfig()


@pytest.mark.parametrize("flag, field", list(zip(ENV_NAMES[:3], ("profile", "skip_ws_zero", "trace_shapes"))))
def test_each_flag_alone(flag, field):
    config = RuntimeConfig.from_env({flag: "1"})
    assert getattr(config, field)
    assert sum((config.profile, config.skip_ws_zero, config.trace_shapes)) == 1


@pytest.mark.parametrize("value", ["-3", "", "1.5", "0x10", " 17", "17 ", "١٧", "abc"])
def test_bad_trace_max_keeps_the_default(value):
    assert RuntimeConfig.from_env({"FERRUM_MARLIN_TRACE_SHAPES_MAX": value}).trace_shapes_max == 256


@pytest.mark.parametrize("value, expected", [("0", 0), ("17", 17), ("007", 7), ("100000", 100000)])
def test_trace_max_unsigned_values(value, expected):
    assert RuntimeConfig.from_env({"FERRUM_MARLIN_TRACE_SHAPES_MAX": value}).trace_shapes_max == expected


def test_trace_max_accepts_a_plus_sign_like_the_original():
    assert RuntimeConfig.from_env({"FERRUM_MARLIN_TRACE_SHAPES_MAX": "+17"}).trace_shapes_max == 17


def test_trace_max_above_u64_keeps_the_default():
    assert RuntimeConfig.from_env({"FERRUM_MARLIN_TRACE_SHAPES_MAX": str(2**64)}).trace_shapes_max == 256


def test_unrelated_variables_are_ignored():
    assert RuntimeConfig.from_env({"FERRUM_MARLIN_PROFILE_X": "1", "PATH": "/bin"}) == RuntimeConfig()


def test_from_env_reads_os_environ_by_default(monkeypatch):
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FERRUM_MARLIN_TRACE_SHAPES", "1")
    monkeypatch.setenv("FERRUM_MARLIN_TRACE_SHAPES_MAX", "3")
    assert RuntimeConfig.from_env() == RuntimeConfig(trace_shapes=True, trace_shapes_max=3)


def test_runtime_config_is_read_once(monkeypatch):
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    profile.runtime_config.cache_clear()
    try:
        first = profile.runtime_config()
        monkeypatch.setenv("FERRUM_MARLIN_PROFILE", "1")
        assert profile.runtime_config() is first
        assert not profile.runtime_config().profile
        profile.runtime_config.cache_clear()
        assert profile.runtime_config().profile
    finally:
        profile.runtime_config.cache_clear()


def test_config_is_frozen():
    with pytest.raises(Exception):
        RuntimeConfig().profile = True  # type: ignore[misc]


# ---- buckets and labels -----------------------------------------------------------


@pytest.mark.parametrize(
    "label, bucket",
    [
        ("label=llama.batched_layer.qkv_proj", "qkv_proj"),
        ("label=llama.forward_layer.o_proj", "o_proj"),
        ("label=llama.forward_layer.gate_up_proj", "gate_up_proj"),
        ("label=llama.forward_layer.down_proj", "down_proj"),
        ("label=llama.batched.lm_head", "lm_head"),
        ("label=<none>", "other"),
        (NO_LABEL, "other"),
        ("", "other"),
        ("model.layers.3.mlp.experts", "other"),
    ],
)
def test_bucket_from_label(label, bucket):
    assert bucket_from_label(label) == bucket


def test_first_matching_bucket_wins_in_the_original_order():
    assert bucket_from_label("qkv_proj.o_proj") == "qkv_proj"
    assert bucket_from_label("o_proj.qkv_proj") == "qkv_proj"
    assert bucket_from_label("down_proj.o_proj") == "o_proj"
    assert bucket_from_label("lm_head.gate_up_proj") == "gate_up_proj"
    assert BUCKETS == ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head", "other")


def test_profile_label_nests_and_resets():
    assert current_label() == NO_LABEL
    with profile_label("layer.qkv_proj"):
        assert current_label() == "layer.qkv_proj"
        with profile_label("layer.o_proj"):
            assert current_label() == "layer.o_proj"
        assert current_label() == "layer.qkv_proj"
    assert current_label() == NO_LABEL


def test_profile_label_resets_on_exception():
    with pytest.raises(RuntimeError):
        with profile_label("layer.down_proj"):
            raise RuntimeError("boom")
    assert current_label() == NO_LABEL


def test_profile_label_is_per_thread():
    import threading

    seen = []
    with profile_label("main.lm_head"):
        worker = threading.Thread(target=lambda: seen.append(current_label()))
        worker.start()
        worker.join()
    assert seen == [NO_LABEL]


# ---- counters --------------------------------------------------------------------


@pytest.fixture
def clean_stats():
    drain_profile()
    yield
    drain_profile()


def test_phase_stats_record_all_phases():  # marlin_profile_bucket_stats_record_all_profile_phases
    stats = PhaseStats()
    stats.record("ws_zero", 3)
    stats.record("gather", 5)
    stats.record("kernel", 7)
    assert (stats.ws_zero_us, stats.ws_zero_calls) == (3, 1)
    assert (stats.gather_us, stats.gather_calls) == (5, 1)
    assert (stats.kernel_us, stats.kernel_calls) == (7, 1)


def test_record_and_drain(clean_stats):
    record("kernel", 7.0, label="llama.batched_layer.qkv_proj")
    record("kernel", 1.5, label="llama.batched_layer.qkv_proj")
    with profile_label("llama.forward_layer.o_proj"):
        record("ws_zero", 3.0)
        record("kernel", 2.0, label="llama.batched.lm_head")  # an explicit label wins
    record_gather(5.0)  # no label: "other"

    snap = drain_profile()
    assert (snap.total.kernel_us, snap.total.kernel_calls) == (10.5, 3)
    assert (snap.total.ws_zero_us, snap.total.ws_zero_calls) == (3.0, 1)
    assert (snap.total.gather_us, snap.total.gather_calls) == (5.0, 1)
    by = snap.by_projection
    assert set(by) == set(BUCKETS)
    assert (by["qkv_proj"].kernel_us, by["qkv_proj"].kernel_calls) == (8.5, 2)
    assert (by["o_proj"].ws_zero_us, by["o_proj"].ws_zero_calls, by["o_proj"].kernel_calls) == (3.0, 1, 0)
    assert (by["lm_head"].kernel_us, by["lm_head"].kernel_calls) == (2.0, 1)
    assert (by["other"].gather_us, by["other"].gather_calls) == (5.0, 1)
    assert by["down_proj"] == PhaseStats()
    assert by["gate_up_proj"] == PhaseStats()


def test_drain_resets(clean_stats):
    record("kernel", 4.0)
    first = drain_profile()
    assert first.total.kernel_calls == 1
    second = drain_profile()
    assert second.total == PhaseStats()
    assert all(stats == PhaseStats() for stats in second.by_projection.values())
    assert first.total.kernel_calls == 1  # a drained snapshot is not touched afterwards


def test_record_gather_uses_the_current_label(clean_stats):
    with profile_label("model.gate_up_proj"):
        record_gather(2.5)
    snap = drain_profile()
    assert (snap.by_projection["gate_up_proj"].gather_us, snap.by_projection["gate_up_proj"].gather_calls) == (2.5, 1)
    assert snap.total.gather_calls == 1


@pytest.mark.parametrize("phase", ["", "kernels", "total", "KERNEL", "gemm"])
def test_bad_phase_is_rejected(clean_stats, phase):
    with pytest.raises(ValueError, match="phase"):
        record(phase, 1.0)
    assert drain_profile().total == PhaseStats()


def test_package_exports():
    import ferrum_ffi

    assert ferrum_ffi.drain_profile is drain_profile
    assert ferrum_ffi.profile_label is profile_label
    assert ferrum_ffi.record_gather is record_gather
    assert ferrum_ffi.runtime_config is profile.runtime_config


# ---- timing ----------------------------------------------------------------------


class FakeEventLib:
    """Just enough of NativeLibrary for profile._EventTimer: events that take 1.5 ms."""

    def __init__(self) -> None:
        self.created = 0
        self.destroyed = 0
        self.recorded = []

    def check(self, entry, code, shape=None):
        assert code == 0, entry

    def ferrum_marlin_event_create(self, ref):
        self.created += 1
        ref._obj.value = 0x1000 * self.created
        return 0

    def ferrum_marlin_event_record(self, event, stream):
        self.recorded.append((event.value, stream))
        return 0

    def ferrum_marlin_event_elapsed_ms(self, start, end, ref):
        ref._obj.value = 1.5
        return 0

    def ferrum_marlin_event_destroy(self, event):
        self.destroyed += 1
        return 0


def test_timed_is_a_no_op_when_profiling_is_off(clean_stats):
    with profile.timed(None, 0, "kernel", RuntimeConfig()):
        pass
    assert drain_profile().total == PhaseStats()


def test_timed_records_event_time_when_profiling_is_on(clean_stats):
    lib = FakeEventLib()
    with profile_label("x.down_proj"):
        with profile.timed(lib, 0x77, "kernel", RuntimeConfig(profile=True)):
            pass
    assert (lib.created, lib.destroyed) == (2, 2)
    assert [stream for _, stream in lib.recorded] == [0x77, 0x77]
    snap = drain_profile()
    assert (snap.total.kernel_us, snap.total.kernel_calls) == (1500.0, 1)
    assert snap.by_projection["down_proj"].kernel_calls == 1


def test_timed_destroys_events_and_records_nothing_on_error(clean_stats):
    lib = FakeEventLib()
    with pytest.raises(KeyError):
        with profile.timed(lib, 0, "ws_zero", RuntimeConfig(profile=True)):
            raise KeyError("launch failed")
    assert (lib.created, lib.destroyed) == (2, 2)
    assert drain_profile().total == PhaseStats()


# ---- shape tracing ----------------------------------------------------------------

TRACE = RuntimeConfig(trace_shapes=True, trace_shapes_max=2)
FIELDS = dict(entry="marlin_gemm", m=16, n=4096, k=4096, gs=128, a_ptr=0x7F0000001000, b_ptr=0, ws_len=64)


@pytest.fixture
def trace_counter(monkeypatch):
    monkeypatch.setattr(profile, "_trace_calls", 0)


def trace_lines(capsys) -> list[str]:
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err.splitlines()


def test_trace_prints_one_line_per_call_up_to_the_max(trace_counter, capsys):
    for _ in range(5):
        trace_shape(TRACE, **FIELDS)
    lines = trace_lines(capsys)
    assert len(lines) == 2
    for call, line in enumerate(lines):
        assert line.startswith(f"[marlin-shape-trace] call={call} label={NO_LABEL} bucket=other ")
        assert " entry=marlin_gemm m=16 n=4096 k=4096 gs=128 " in line
        assert " a_ptr=0x7f0000001000 " in line
        assert " b_ptr=0x0 " in line
        assert line.endswith(" ws_len=64")
    assert profile._trace_calls == 5


def test_trace_carries_the_label_and_bucket(trace_counter, capsys):
    with profile_label("llama.forward_layer.gate_up_proj"):
        trace_shape(TRACE, m=1)
    (line,) = trace_lines(capsys)
    assert line == "[marlin-shape-trace] call=0 label=llama.forward_layer.gate_up_proj bucket=gate_up_proj m=1"


def test_trace_max_zero_prints_nothing(trace_counter, capsys):
    trace_shape(RuntimeConfig(trace_shapes=True, trace_shapes_max=0), **FIELDS)
    assert trace_lines(capsys) == []


def test_no_trace_when_off(trace_counter, capsys):
    for _ in range(3):
        trace_shape(RuntimeConfig(trace_shapes=False, trace_shapes_max=100), **FIELDS)
    assert trace_lines(capsys) == []
    assert profile._trace_calls == 0  # calls are only counted while tracing


def test_pointer_fields_are_hex_and_others_decimal(trace_counter, capsys):
    trace_shape(TRACE, c_ptr=255, s_ptr=4096, qweight_len=255)
    (line,) = trace_lines(capsys)
    assert "c_ptr=0xff" in line
    assert "s_ptr=0x1000" in line
    assert "qweight_len=255" in line
