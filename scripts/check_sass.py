#!/usr/bin/env python3
"""Scan a built libferrum_marlin.so's SASS for instructions the GPU rejects.

ptxas 13.0 can fold a uniform shared-memory offset into an asynchronous global
copy (LDGSTS) that already carries an L2 cache-policy descriptor; both uniform
operands then share one field (the disassembly shows `[R+URn], desc[URn+1]`, the
descriptor on an odd register) and the H200 stops the kernel with an illegal
instruction. It happened to the 8-warp kernel's rolled first copies in 64-row
INT4 tiles (session 36); every build of the kernels can be checked here without
a GPU: cuobjdump and nvdisasm from a CUDA toolkit, or the nvidia-cuda-cuobjdump
and nvidia-cuda-nvdisasm wheels, on PATH.

    python scripts/check_sass.py [LIBRARY]   # default: the library ferrum_ffi loads
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FUNCTION = re.compile(r"Function : (\S+)")
# A copy whose address adds a uniform register and that names a descriptor,
# or whose 64-bit descriptor sits on an odd uniform register.
SHARED_FIELD = re.compile(r"LDGSTS[^;]*\+UR\d+[^;]*desc\[UR|LDGSTS[^;]*desc\[UR\d*[13579]\]")


def default_library() -> Path:
    from ferrum_ffi import _native

    for path in _native._search_paths():
        if path.is_file():
            return path
    raise SystemExit("no built library found: pass its path")


def scan(library: Path) -> dict[str, list[str]]:
    """Kernel name -> offending SASS lines."""
    tool = shutil.which("cuobjdump")
    if tool is None:
        raise SystemExit("cuobjdump not found on PATH (see this script's docstring)")
    found: dict[str, list[str]] = {}
    kernel = "?"
    with subprocess.Popen([tool, "-sass", str(library)], stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            match = FUNCTION.search(line)
            if match:
                kernel = match.group(1)
            elif SHARED_FIELD.search(line):
                found.setdefault(kernel, []).append(line.strip())
    if proc.returncode != 0:
        raise SystemExit(f"cuobjdump failed with status {proc.returncode}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("library", nargs="?", type=Path)
    args = parser.parse_args(argv)
    library = args.library or default_library()
    found = scan(library)
    for kernel, lines in found.items():
        print(kernel)
        for line in lines:
            print("    " + line)
    print(f"{library}: {sum(map(len, found.values()))} rejected instructions in {len(found)} kernels")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
