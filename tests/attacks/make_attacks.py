#!/usr/bin/env python3
"""Writes the hostile .safetensors files of this folder and expected.tsv.

Each file breaks one rule of the reference reader (shared/reference/formats.md
§1.2 and §1.5) and is named after it; expected.tsv pairs it with a substring
of the error shardsafe must give (all are DataLoss). Run from anywhere:
    python3 tests/attacks/make_attacks.py
The files are checked in; src/format/safetensors_test.cc reads them.
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
F32_A = '"dtype":"F32","shape":[2],"data_offsets":[0,8]'


def framed(header: bytes, data: int = 0, n=None) -> bytes:
    """u64 LE length (len(header) unless n is given), header, `data` zero bytes."""
    return struct.pack("<Q", len(header) if n is None else n) + header + b"\0" * data


def one(info: str, data: int = 8) -> bytes:
    return framed(('{"a":{' + info + '}}').encode(), data)


def tensors(*infos, data: int) -> bytes:
    body = ",".join('"%s":{%s}' % (name, info) for name, info in infos)
    return framed(("{" + body + "}").encode(), data)


def u8(begin, end, n=None):
    n = end - begin if n is None else n
    return '"dtype":"U8","shape":[%d],"data_offsets":[%d,%d]' % (n, begin, end)


ATTACKS = [
    # Steps 1-3: the length prefix.
    ("header_too_small", b"\x02\0\0\0\0", "header too small"),
    ("header_too_large", framed(b"{}", n=100_000_001), "header too large"),
    ("header_length_u64_max", framed(b"{}", n=2**64 - 1), "header too large"),
    ("invalid_header_length", framed(b"{}      ", n=64), "invalid header length"),
    # Step 4: UTF-8.
    ("invalid_utf8", framed(b'{"\xff":1}'), "invalid UTF-8 in header"),
    ("invalid_utf8_overlong", framed(b'{"\xc0\xaf":1}'), "invalid UTF-8 in header"),
    ("invalid_utf8_surrogate", framed(b'{"\xed\xa0\x80":1}'), "invalid UTF-8 in header"),
    ("invalid_utf8_truncated", framed(b'{}    \xe2\x82'), "incomplete utf-8"),
    # Step 5: JSON syntax.
    ("json_empty_header", framed(b""), "invalid JSON in header"),
    ("json_byte_order_mark", framed(b"\xef\xbb\xbf{}   "), "invalid JSON in header"),
    ("json_nul_padding", framed(b"{}\0\0\0\0\0\0"), "invalid JSON in header: NUL byte"),
    ("json_top_level_array", framed(b"[]      "), "invalid JSON in header: invalid type"),
    ("json_trailing_characters", framed(b"{}  x   "), "invalid JSON in header"),
    ("json_lone_surrogate_escape", framed(b'{"\\ud800":1}'), "invalid JSON in header"),
    ("json_raw_control_character", framed(b'{"a\tb":1}'), "invalid JSON in header"),
    ("json_recursion_limit", one(F32_A + ',"x":' + "[" * 126 + "]" * 126), "recursion limit"),
    ("json_number_out_of_range", one(F32_A + ',"x":1e400'), "invalid JSON in header: number"),
    # Step 5: the schema.
    ("schema_unknown_dtype", one('"dtype":"F128","shape":[2],"data_offsets":[0,8]'),
     "unknown variant `F128`"),
    ("schema_lowercase_dtype", one('"dtype":"f32","shape":[2],"data_offsets":[0,8]'),
     "unknown variant `f32`"),
    ("schema_float_shape", one('"dtype":"F32","shape":[2.0],"data_offsets":[0,8]'),
     "floating point `2.0`, expected usize"),
    ("schema_exponent_shape", one('"dtype":"F32","shape":[2e0],"data_offsets":[0,8]'),
     "expected usize"),
    ("schema_negative_shape", one('"dtype":"F32","shape":[-2],"data_offsets":[0,8]'),
     "integer `-2`, expected usize"),
    ("schema_negative_zero_shape", one('"dtype":"F32","shape":[-0],"data_offsets":[0,0]', 0),
     "expected usize"),
    ("schema_shape_above_u64",
     one('"dtype":"F32","shape":[18446744073709551616,0],"data_offsets":[0,0]', 0),
     "expected usize"),
    ("schema_data_offsets_three_elements",
     one('"dtype":"F32","shape":[2],"data_offsets":[0,8,8]'), "expected a tuple of size 2"),
    ("schema_data_offsets_one_element",
     one('"dtype":"F32","shape":[2],"data_offsets":[0]'), "expected a tuple of size 2"),
    ("schema_data_offsets_object",
     one('"dtype":"F32","shape":[2],"data_offsets":{"0":0,"1":8}'), "expected a tuple of size 2"),
    ("schema_missing_dtype", one('"shape":[2],"data_offsets":[0,8]'), "missing field `dtype`"),
    ("schema_missing_shape", one('"dtype":"F32","data_offsets":[0,8]'), "missing field `shape`"),
    ("schema_missing_data_offsets", one('"dtype":"F32","shape":[2]'),
     "missing field `data_offsets`"),
    ("schema_duplicate_field", one('"dtype":"F32",' + F32_A), "duplicate field `dtype`"),
    ("schema_duplicate_metadata", framed(b'{"__metadata__":{},"__metadata__":{}}'),
     "duplicate field `__metadata__`"),
    ("schema_metadata_value_not_string", framed(b'{"__metadata__":{"format":1}}'),
     "expected a string"),
    ("schema_metadata_not_object", framed(b'{"__metadata__":["pt"]}'), "expected a map"),
    ("schema_tensor_named_metadata",
     framed(('{"__metadata__":{' + F32_A + '}}').encode(), 8), "expected a string"),
    ("schema_tensor_info_not_object", framed(b'{"a":"F32"}'), "expected struct TensorInfo"),
    # Step 6: offsets and sizes.
    ("offset_gap", tensors(("a", u8(0, 8)), ("b", u8(9, 17)), data=17),
     "invalid offset for tensor `b`"),
    ("offset_overlap", tensors(("a", u8(0, 8)), ("b", u8(4, 12)), data=12),
     "invalid offset for tensor `b`"),
    ("offset_not_at_zero", tensors(("a", u8(1, 9)), data=9), "invalid offset for tensor `a`"),
    ("offset_end_before_begin", tensors(("a", u8(0, 4)), ("b", u8(4, 2, n=0)), data=4),
     "invalid offset for tensor `b`"),
    ("offset_duplicate_name_leaves_hole", tensors(("a", u8(0, 16)), ("a", u8(16, 32)), data=32),
     "invalid offset for tensor `a`"),
    ("overflow_shape_product",
     one('"dtype":"F32","shape":[18446744073709551615,2,0],"data_offsets":[0,0]', 0),
     "overflow computing buffer size"),
    ("overflow_bit_count",
     one('"dtype":"U8","shape":[2305843009213693952],"data_offsets":[0,0]', 0),
     "overflow computing buffer size"),
    ("misaligned_f4_odd_count", one('"dtype":"F4","shape":[3],"data_offsets":[0,1]', 1),
     "misaligned slice"),
    ("misaligned_f4_scalar", one('"dtype":"F4","shape":[],"data_offsets":[0,1]', 1),
     "misaligned slice"),
    ("misaligned_f6_three", one('"dtype":"F6_E2M3","shape":[3],"data_offsets":[0,2]', 2),
     "misaligned slice"),
    ("tensor_invalid_info_size_mismatch", one('"dtype":"F32","shape":[2],"data_offsets":[0,7]', 7),
     "invalid shape, data type, or offset for tensor `a`"),
    # Step 7: the file ends exactly at the last tensor.
    ("incomplete_trailing_bytes", one(F32_A, 9), "incomplete metadata, file not fully covered"),
    ("incomplete_truncated_data", one(F32_A, 7), "incomplete metadata, file not fully covered"),
    ("incomplete_empty_header_with_data", framed(b"{}      ", 1), "incomplete metadata"),
]


def main():
    for old in os.listdir(HERE):
        if old.endswith(".safetensors"):
            os.remove(os.path.join(HERE, old))
    lines = ["# file\texpected substring of the DataLoss message (make_attacks.py writes this)"]
    for name, data, want in ATTACKS:
        with open(os.path.join(HERE, name + ".safetensors"), "wb") as f:
            f.write(data)
        lines.append("%s.safetensors\t%s" % (name, want))
    with open(os.path.join(HERE, "expected.tsv"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
