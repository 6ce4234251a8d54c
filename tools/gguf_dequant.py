#!/usr/bin/env python3
"""gguf_dequant.py - the oracle for llm.h's dequantization: every quantized tensor of a GGUF file, as Python's
`gguf` package (llama.cpp's own) dequantizes it, for test.c to compare with llm_dtype_dequant_row bit for bit.

    python3 tools/gguf_dequant.py MODEL.gguf

Writes, for each tensor that is neither f32, f16 nor bf16: a line "NAME TYPE N_VALUES", then N_VALUES
little-endian f32 values.
"""
import sys

import numpy as np
from gguf import GGUFReader
from gguf.constants import GGMLQuantizationType as T
from gguf.quants import dequantize

reader = GGUFReader(sys.argv[1])
out = sys.stdout.buffer
for t in reader.tensors:
    if t.tensor_type in (T.F32, T.F16, T.BF16):
        continue
    values = dequantize(t.data, t.tensor_type).astype("<f4", copy=False).reshape(-1)
    out.write(b"%s %s %d\n" % (t.name.encode(), t.tensor_type.name.lower().encode(), values.size))
    out.write(np.ascontiguousarray(values).tobytes())
