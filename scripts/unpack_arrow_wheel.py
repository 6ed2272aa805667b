#!/usr/bin/env python3
"""Unpacks Arrow C++ from PyPI's pyarrow wheel into a project folder (scripts/setup.sh).

    python3 scripts/unpack_arrow_wheel.py pyarrow-26.0.1-...manylinux_2_28_x86_64.whl .deps/pyarrow 26.0.1

Writes DST/include/{arrow,parquet}/..., DST/lib/libarrow.so.N and libparquet.so.N (the two
libraries RoundPipe links; their RUNPATH $ORIGIN finds each other) and DST/VERSION, through
DST.part renamed at the end, so an interrupted unpack leaves nothing half-written. Only the
C++ parts are taken: nothing is installed into any Python.
"""
import os
import re
import shutil
import sys
import zipfile

src, dst, version = sys.argv[1], sys.argv[2], sys.argv[3]
tmp = dst + ".part"
shutil.rmtree(tmp, ignore_errors=True)
lib = re.compile(r"^pyarrow/(libarrow|libparquet)\.so\.\d+$")
with zipfile.ZipFile(src) as z:
    for n in z.namelist():
        if n.endswith("/"):
            continue
        if n.startswith("pyarrow/include/arrow/") or n.startswith("pyarrow/include/parquet/"):
            out = os.path.join(tmp, n[len("pyarrow/"):])
        elif lib.match(n):
            out = os.path.join(tmp, "lib", os.path.basename(n))
        else:
            continue
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with z.open(n) as f, open(out, "wb") as g:
            shutil.copyfileobj(f, g)
with open(os.path.join(tmp, "VERSION"), "w") as f:
    f.write(version + "\n")
shutil.rmtree(dst, ignore_errors=True)
os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
os.replace(tmp, dst)
