"""scripts/check_sass.py: which SASS copies it reports, on listings taken from real builds."""

from __future__ import annotations

import os
import stat

from .script_modules import script_module

# From session 36's rejected build (the H200 stopped at the first) and from main.
REJECTED = [
    "/*14d0*/  LDGSTS.E.BYPASS.128 [R11+UR0], desc[UR1][R14.64] ;  /* 0x000000000e0b7dae */",
    "/*1500*/  LDGSTS.E.BYPASS.128 [R11+UR0+0x1000], desc[UR1][R12.64] ;  /* 0x010000000c0b7dae */",
]
ACCEPTED = [
    "/*2390*/  LDGSTS.E.BYPASS.128 [R5], desc[UR30][R14.64] ;  /* 0x000000000e057fae */",
    "/*1550*/  @!P0 LDGSTS.E.BYPASS.128 [R9+0x8000], desc[UR32][R18.64], P4 ;  /* 0x0800000012098fae */",
    "/*32f0*/  HGMMA.64x64x16.F32 R24, R152, gdesc[UR4], R24 ;  /* 0x00e0000498187df0 */",
    "/*0100*/  LDG.E.128 R4, desc[UR5][R2.64] ;",
]


def test_the_pattern_reports_only_the_shared_field():
    with script_module("check_sass.py") as module:
        assert all(module.SHARED_FIELD.search(line) for line in REJECTED)
        assert not any(module.SHARED_FIELD.search(line) for line in ACCEPTED)


def test_scan_names_the_kernel_of_each_rejected_copy(tmp_path, monkeypatch):
    listing = tmp_path / "listing.txt"
    listing.write_text(
        "\n".join(
            ["\tFunction : good_kernel", *ACCEPTED, "\tFunction : bad_kernel", ACCEPTED[0], *REJECTED, ""]
        )
    )
    tool = tmp_path / "cuobjdump"
    tool.write_text(f"#!/bin/sh\ncat '{listing}'\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", os.pathsep.join([str(tmp_path), os.environ.get("PATH", "")]))
    with script_module("check_sass.py") as module:
        found = module.scan(tmp_path / "libferrum_marlin.so")
    assert list(found) == ["bad_kernel"]
    assert [line.split()[0] for line in found["bad_kernel"]] == ["/*14d0*/", "/*1500*/"]
