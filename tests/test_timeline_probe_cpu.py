"""scripts/timeline_probe.py on the CPU: its parser against the line the
kernel's probe prints (core/timeline_probe.cuh) and its phase summary against
hand-computed timelines."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .script_modules import script_module

ROOT = Path(__file__).resolve().parents[1]
HEADER = ROOT / "native" / "src" / "core" / "timeline_probe.cuh"


@pytest.fixture(scope="module")
def probe():
    with script_module("timeline_probe.py") as module:
        yield module


def line(block, units, stamps_us, waited_us=0.0, n=1536, k=2048):
    ns = [int(round(t * 1000)) + 10**12 for t in stamps_us]
    return " ".join(["FERRUM_TIMELINE", str(block), "3", str(units), "256", "64", str(n), str(k)]
                    + [str(t) for t in ns] + [str(int(waited_us * 1000))])


def test_the_parser_reads_what_the_kernel_prints(probe):
    text = HEADER.read_text()
    fmt = re.search(r'printf\("FERRUM_TIMELINE ([^"]*)\\n"', text).group(1)
    conversions = fmt.split()
    assert all(c.startswith("%") for c in conversions)
    assert len(conversions) == 7 + len(probe.POINTS) + 1
    points = re.search(r"enum Point \{(.*?)\};", text, re.S).group(1)
    names = re.findall(r"^\s*k(\w+)", points, re.M)
    assert len(names) - 1 == len(probe.POINTS)  # kPoints counts them
    block = probe.parse_line(line(7, 3, [0, 1, 2, 3, 4, 5, 6, 7], 0.5))
    assert (block.block, block.sm, block.units, block.n_tile, block.k_tile, block.n, block.k) == (7, 3, 3, 256, 64,
                                                                                               1536, 2048)
    assert block.waited == 500 and block.at[7] - block.at[0] == 7000
    assert probe.parse_line("FERRUM_TIMELINE 1 2 3") is None
    assert probe.parse_line("P " + line(1, 1, range(8))[16:]) is None


def test_cases_are_cut_by_their_markers(probe):
    lines = [
        line(0, 2, range(8)),  # before any marker: not a case's
        "BEGIN qwen gate_up M=1#0", line(0, 2, range(8)), "noise", "END qwen gate_up M=1#0",
        "BEGIN qwen gate_up M=1#1", line(0, 2, range(8)), line(1, 2, range(8)), "END qwen gate_up M=1#1",
        line(2, 2, range(8)),
    ]
    cases = probe.parse(lines)
    assert {name: len(blocks) for name, blocks in cases.items()} == {"qwen gate_up M=1#0": 1,
                                                                    "qwen gate_up M=1#1": 2}


def test_phases_are_summarised_per_kernel(probe):
    # Four working blocks of one kernel whose compute phases last 1, 2, 3 and
    # 4 us, one idle block, and a second kernel (other n, k) starting at 20 us.
    lines = ["BEGIN layer#1"]
    for i, compute in enumerate((1.0, 2.0, 3.0, 4.0)):
        t0 = 0.1 * i
        lines.append(line(i, 6, [t0, t0 + 1.0, t0 + 1.5, t0 + 2.0, t0 + 2.5, t0 + 2.5 + compute,
                                 t0 + 3.0 + compute, t0 + 3.5 + compute], waited_us=0.2 * i))
    lines.append(line(9, 0, [0.0] * 8))
    lines.append(line(0, 3, [20.0, 20.5, 21.0, 21.5, 22.0, 23.0, 23.5, 24.0], n=2048, k=768))
    lines.append("END layer#1")
    summary = probe.summarize_log("\n".join(lines))
    first, second = summary.split("layer#1 n=2048 k=768")
    assert "layer#1 n=1536 k=2048: 4 blocks, tile(s) [(256, 64)], units 6..6" in first

    def row(text, label):
        match = re.search(rf"^  {re.escape(label)}\s+(.*)$", text, re.M)
        return [float(v) for v in match.group(1).split()]

    # percentiles 0/10/50/90/100 of 1, 2, 3, 4 (linear interpolation)
    assert row(first, "compute") == pytest.approx([1.0, 1.3, 2.5, 3.7, 4.0], abs=0.006)
    assert row(first, "routing") == pytest.approx([1.0] * 5, abs=0.006)
    assert row(first, "later waits") == pytest.approx([0.0, 0.06, 0.3, 0.54, 0.6], abs=0.006)
    assert row(first, "end")[-1] == pytest.approx(0.3 + 3.5 + 4.0, abs=0.006)
    assert row(second, "start") == pytest.approx([20.0] * 5, abs=0.006)
    assert row(second, "store") == pytest.approx([0.5] * 5, abs=0.006)
