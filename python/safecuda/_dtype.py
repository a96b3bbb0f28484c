"""Element types (sc_dtype) and their Python names, struct formats and sizes."""

import enum
import math
import struct


class DType(enum.IntEnum):
    """sc_dtype. Wherever a dtype is taken, a DType, its short name ("f32", "bf16"), a
    long name ("float32", "bfloat16"), a numpy dtype or a torch dtype may be given."""
    U8 = 1
    I8 = 2
    U16 = 3
    I16 = 4
    U32 = 5
    I32 = 6
    U64 = 7
    I64 = 8
    F16 = 9
    BF16 = 10
    F32 = 11
    F64 = 12
    F8E4M3 = 13
    F8E5M2 = 14

    @property
    def size(self):
        return _SIZE[self]

    @property
    def short_name(self):
        return _SHORT[self]

    @property
    def format(self):
        """The struct / memoryview format of one element (bf16: its 16 raw bits, 'H')."""
        return _FORMAT[self]

    @property
    def kind(self):
        """'u', 'i' or 'f' (bf16: 'f')."""
        return _KIND[self]

    def __str__(self):
        return _SHORT[self]


_TABLE = [
    # dtype, short, long names, struct format, size, kind
    (DType.U8, "u8", ("uint8",), "B", 1, "u"),
    (DType.I8, "i8", ("int8",), "b", 1, "i"),
    (DType.U16, "u16", ("uint16",), "H", 2, "u"),
    (DType.I16, "i16", ("int16",), "h", 2, "i"),
    (DType.U32, "u32", ("uint32",), "I", 4, "u"),
    (DType.I32, "i32", ("int32", "int"), "i", 4, "i"),
    (DType.U64, "u64", ("uint64",), "Q", 8, "u"),
    (DType.I64, "i64", ("int64", "long"), "q", 8, "i"),
    (DType.F16, "f16", ("float16", "half"), "e", 2, "f"),
    (DType.BF16, "bf16", ("bfloat16",), "H", 2, "f"),
    (DType.F32, "f32", ("float32", "float"), "f", 4, "f"),
    (DType.F64, "f64", ("float64", "double"), "d", 8, "f"),
    (DType.F8E4M3, "f8e4m3", ("float8_e4m3fn",), "B", 1, "f"),
    (DType.F8E5M2, "f8e5m2", ("float8_e5m2",), "B", 1, "f"),
]
_SIZE = {t[0]: t[4] for t in _TABLE}
_SHORT = {t[0]: t[1] for t in _TABLE}
_FORMAT = {t[0]: t[3] for t in _TABLE}
_KIND = {t[0]: t[5] for t in _TABLE}
_NAMES = {}
for _t in _TABLE:
    _NAMES[_t[1]] = _t[0]
    for _n in _t[2]:
        _NAMES[_n] = _t[0]
    _NAMES[_t[0].name.lower()] = _t[0]
del _t, _n


def as_dtype(value):
    """A DType from a DType, an int, a name, a numpy dtype or a torch dtype."""
    if isinstance(value, DType):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return DType(value)
    if isinstance(value, str):
        d = _NAMES.get(value.lower().replace("torch.", "").replace("numpy.", ""))
        if d is None:
            raise ValueError(f"unknown dtype '{value}' (safecuda has: "
                             f"{', '.join(t[1] for t in _TABLE)})")
        return d
    text = str(value)  # torch.float32 -> "torch.float32", numpy dtype('float32') -> "float32"
    if text.startswith("torch."):
        text = text[len("torch."):]
    d = _NAMES.get(text.lower())
    if d is None:
        name = getattr(value, "name", None)  # numpy dtypes
        d = _NAMES.get(str(name).lower()) if name else None
    if d is None:
        raise ValueError(f"no safecuda dtype for {value!r}")
    return d


# Host formats (struct / buffer protocol) as (kind, size).
_FORMAT_KIND = {
    "b": ("i", 1), "B": ("u", 1), "h": ("i", 2), "H": ("u", 2), "i": ("i", 4),
    "I": ("u", 4), "l": ("i", struct.calcsize("l")), "L": ("u", struct.calcsize("L")),
    "q": ("i", 8), "Q": ("u", 8), "n": ("i", struct.calcsize("n")),
    "N": ("u", struct.calcsize("N")), "e": ("f", 2), "f": ("f", 4), "d": ("f", 8),
    "c": ("u", 1), "?": ("u", 1),
}


def host_format_kind(fmt):
    """(kind, size) of a buffer protocol format, None when it is not a plain scalar."""
    f = fmt.lstrip("@=<>!")
    return _FORMAT_KIND.get(f)


def dtype_for_host_format(fmt):
    """The DType a host buffer of this format holds, None when there is none."""
    k = host_format_kind(fmt)
    if k is None:
        return None
    for d in DType:
        if d is not DType.BF16 and (d.kind, d.size) == k:
            return d
    return None


def host_compatible(fmt, dtype):
    """Whether host elements of format fmt may be copied as dtype: raw bytes (B, b, c)
    always; otherwise the same kind and size (bf16 takes u16 bit patterns)."""
    k = host_format_kind(fmt)
    if k is None:
        return False
    if fmt.lstrip("@=<>!") in ("B", "b", "c"):
        return True
    if dtype is DType.BF16:
        return k == ("u", 2)
    return k == (dtype.kind, dtype.size)


def float_to_bf16_bits(x):
    """The bf16 bit pattern nearest to x (round to nearest even, NaN kept)."""
    if math.isnan(x):
        return 0x7FC0
    (u,) = struct.unpack("<I", struct.pack("<f", x))
    u += 0x7FFF + ((u >> 16) & 1)
    return (u >> 16) & 0xFFFF


def bf16_bits_to_float(bits):
    (f,) = struct.unpack("<f", struct.pack("<I", (bits & 0xFFFF) << 16))
    return f


def pack_scalar(dtype, value):
    """One element of dtype as bytes (for fills)."""
    if dtype is DType.BF16:
        return struct.pack("<H", float_to_bf16_bits(float(value)))
    return struct.pack("<" + dtype.format, value)
