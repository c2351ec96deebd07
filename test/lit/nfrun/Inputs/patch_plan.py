#!/usr/bin/env python3
"""Writes a damaged copy of a plan: `patch_plan.py IN OUT CASE`.

CASE: truncate (half the file), major (version_major + 1), minor
(version_minor + 1), identifier (not "NFPL"), flip (bytes in the middle)."""
import struct
import sys

src, dst, case = sys.argv[1:4]
b = bytearray(open(src, "rb").read())
if case == "truncate":
    b = b[: len(b) // 2]
elif case in ("major", "minor"):
    root = struct.unpack_from("<I", b, 0)[0]
    vtable = root - struct.unpack_from("<i", b, root)[0]
    field = struct.unpack_from("<H", b, vtable + (4 if case == "major" else 6))[0]
    value = struct.unpack_from("<I", b, root + field)[0]
    struct.pack_into("<I", b, root + field, value + 1)
elif case == "identifier":
    b[4:8] = b"XXXX"
elif case == "flip":
    for i in range(len(b) // 3, len(b) // 3 + 64):
        b[i] ^= 0xFF
else:
    sys.exit("unknown case " + case)
open(dst, "wb").write(bytes(b))
