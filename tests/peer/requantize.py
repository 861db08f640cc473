"""Writes a copy of a GGUF model with its 2-D weight matrices quantized
anew by llama.cpp's own Python library (gguf-py, PyPI's gguf): an F32 file
in, Q8_0 / Q5_0 / Q4_0 / Q4_1 out (what gguf-py can quantize), every other
tensor and every metadata key as they were. The quality gate's tests use it
to make canaries that serve fine and answer a little (or much) worse.

usage: python3 requantize.py IN.gguf OUT.gguf TYPE"""
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T


def copy_fields(reader, writer):
    for f in reader.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue  # the header's own, and the architecture the writer was made with
        vtype = f.types[0]
        sub = f.types[1] if vtype == gguf.GGUFValueType.ARRAY and len(f.types) > 1 else None
        writer.add_key_value(f.name, f.contents(), vtype, sub_type=sub)


def main(src, dst, qname):
    qtype = T[qname]
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(dst, arch)
    copy_fields(reader, writer)
    for t in reader.tensors:
        data = np.array(t.data)
        shape = [int(x) for x in reversed(t.shape.tolist())]  # numpy order (rows, cols)
        if t.tensor_type == T.F32 and len(shape) == 2 and t.name.endswith(".weight") and shape[1] % 32 == 0:
            q = gguf.quants.quantize(data.reshape(shape).astype(np.float32), qtype)
            writer.add_tensor(t.name, q, raw_shape=q.shape, raw_dtype=qtype)
        else:
            writer.add_tensor(t.name, data, raw_shape=data.shape, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
