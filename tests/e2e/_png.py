"""Read the pixels of an 8-bit, non-interlaced PNG (what headless Chromium's screenshots are).

A test helper, so the tests need no imaging library: ``read_png(path)`` returns a numpy
array of shape ``(height, width, channels)``, dtype uint8.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np

_CHANNELS = {0: 1, 2: 3, 4: 2, 6: 4}


def read_png(path: str | Path) -> np.ndarray:
    data = Path(path).read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path}: not a PNG file")
    pos, idat, header = 8, bytearray(), None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
    if header is None:
        raise ValueError(f"{path}: no IHDR chunk")
    width, height, depth, color, _, _, interlace = header
    if depth != 8 or color not in _CHANNELS or interlace:
        raise ValueError(f"{path}: only 8-bit non-interlaced PNGs are read (depth {depth}, color {color})")
    bpp = _CHANNELS[color]
    stride = width * bpp
    raw = zlib.decompress(bytes(idat))
    out = np.zeros((height, stride), np.uint8)
    prev = np.zeros(stride, np.uint8)
    for row in range(height):
        start = row * (stride + 1)
        kind = raw[start]
        line = np.frombuffer(raw, np.uint8, stride, start + 1)
        if kind == 0:
            cur = line.copy()
        elif kind == 1:  # Sub: a running sum per channel, modulo 256
            cur = np.cumsum(line.reshape(width, bpp), axis=0, dtype=np.uint8).reshape(stride)
        elif kind == 2:  # Up
            cur = line + prev
        else:
            cur = _average_or_paeth(kind, bytes(line), bytes(prev), bpp)
        out[row] = cur
        prev = cur
    return out.reshape(height, width, bpp)


def _average_or_paeth(kind: int, line: bytes, prev: bytes, bpp: int) -> np.ndarray:
    cur = bytearray(len(line))
    for i, value in enumerate(line):
        left = cur[i - bpp] if i >= bpp else 0
        up = prev[i]
        if kind == 3:
            cur[i] = (value + ((left + up) >> 1)) & 0xFF
            continue
        upper_left = prev[i - bpp] if i >= bpp else 0
        p = left + up - upper_left
        pa, pb, pc = abs(p - left), abs(p - up), abs(p - upper_left)
        predictor = left if pa <= pb and pa <= pc else up if pb <= pc else upper_left
        cur[i] = (value + predictor) & 0xFF
    return np.frombuffer(bytes(cur), np.uint8)
