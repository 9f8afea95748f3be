#!/usr/bin/env python3
"""Writes the seed inputs of the fuzzers into tests/fuzz/corpus/ (run once; the files are kept).

corpus/npy/: well-formed .npy files of every kind the reader accepts (float32 2-D and 4-D, uint8
and bool masks, format versions 1 to 3, empty and scalar shapes) and a few broken ones, so the
fuzzer starts from real headers. corpus/backends/ and corpus/paths/: random byte strings;
fuzz_backends reads its problem (shapes, options, values), fuzz_paths its input and output paths,
from any bytes.
"""
import os
import random
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def npy(descr, shape, payload, version=1, fortran="False"):
    dims = "".join("%d, " % s for s in shape).rstrip(" ")
    if len(shape) != 1:
        dims = dims.rstrip(",")
    header = "{'descr': '%s', 'fortran_order': %s, 'shape': (%s), }" % (descr, fortran, dims)
    prefix = 10 if version == 1 else 12
    header += " " * ((64 - (prefix + len(header) + 1) % 64) % 64) + "\n"
    length = struct.pack("<H" if version == 1 else "<I", len(header))
    return b"\x93NUMPY" + bytes([version, 0]) + length + header.encode("latin1") + payload


def floats(n, rng):
    return struct.pack("<%df" % n, *[rng.gauss(0, 1) for _ in range(n)])


def main():
    rng = random.Random(2022)
    seeds = {
        "f4_2d.npy": npy("<f4", (5, 8), floats(40, rng)),
        "f4_4d.npy": npy("<f4", (2, 3, 4, 2), floats(48, rng)),
        "f4_v2.npy": npy("<f4", (3, 1), floats(3, rng), version=2),
        "f4_v3.npy": npy("<f4", (1, 2), floats(2, rng), version=3),
        "f4_scalar.npy": npy("<f4", (), floats(1, rng)),
        "f4_empty.npy": npy("<f4", (0, 4), b""),
        "u1_mask.npy": npy("|u1", (2, 3), bytes([1, 0, 1, 1, 1, 0])),
        "b1_mask.npy": npy("|b1", (3,), bytes([1, 0, 1])),
        "bad_dtype.npy": npy("<f8", (2,), floats(4, rng)),
        "bad_fortran.npy": npy("<f4", (2, 2), floats(4, rng), fortran="True"),
        "bad_short.npy": npy("<f4", (4, 4), floats(15, rng)),
    }
    out = os.path.join(HERE, "corpus", "npy")
    os.makedirs(out, exist_ok=True)
    for name, data in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    out = os.path.join(HERE, "corpus", "backends")
    os.makedirs(out, exist_ok=True)
    for i, size in enumerate([16, 32, 64, 64, 128, 128, 256, 512]):
        with open(os.path.join(out, "random_%d" % i), "wb") as f:
            f.write(bytes(rng.randrange(256) for _ in range(size)))
    # Drawn after the others, so that their bytes stay what they were.
    out = os.path.join(HERE, "corpus", "paths")
    os.makedirs(out, exist_ok=True)
    for i, size in enumerate([8, 16, 32, 64]):
        with open(os.path.join(out, "random_%d" % i), "wb") as f:
            f.write(bytes(rng.randrange(256) for _ in range(size)))


if __name__ == "__main__":
    main()
