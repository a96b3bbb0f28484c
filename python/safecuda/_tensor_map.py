"""Tensor maps (sm_90 and newer): a view described for the bulk tensor copy engine (TMA),
passed to a kernel as a `const __grid_constant__ CUtensorMap` parameter with TensorMapIn /
TensorMapOut. The C header (include/safecuda.h, "Tensor maps") documents every check, the
shared-memory layout of a box and the rule a kernel's coordinates must follow (the
innermost one a multiple of 16 bytes)."""

from ctypes import addressof, byref, c_uint8

from ._core import Arg, View, _check
from ._lib import (SC_ARG_TENSOR_MAP_IN, SC_ARG_TENSOR_MAP_OUT, SC_TENSOR_MAP_BYTES,
                   SC_TENSOR_MAP_MAX_RANK, lib, sc_arg, sc_tensor_map, sc_tensor_map_desc)

_SWIZZLE = {None: 0, 0: 0, 32: 1, 64: 2, 128: 3}
_OOB_FILL = {"zero": 0, "nan": 1}
_L2 = {None: 0, "none": 1, 64: 2, 128: 3, 256: 4}


def _ints(name, values, rank, lo, hi):
    values = tuple(values)
    if len(values) != rank:
        raise ValueError(f"{name} has {len(values)} values for {rank} dimensions (give one "
                         f"per dimension, innermost first)")
    out = []
    for i, v in enumerate(values):
        v = int(v.__index__() if hasattr(v, "__index__") else v)
        if not lo <= v <= hi:
            raise ValueError(f"{name}[{i}] = {v}: outside {lo} .. {hi}")
        out.append(v)
    return out


class TensorMap:
    """TensorMap(view, dims, box, *, strides=None, element_strides=None, swizzle=None,
    oob_fill="zero", l2_promotion=None): view described as an array of 1 to 5 dimensions
    and the box one copy moves.

    dims, box, strides and element_strides list the dimensions INNERMOST FIRST, as the
    driver takes them: a C-ordered array x[D][H][W] is dims=(W, H, D). strides are in
    elements (None, or 0 for a dimension, means packed; strides[0] is 0 or 1); the view
    must hold the array's last element. swizzle: None, 32, 64 or 128 (bytes); oob_fill:
    "zero" or "nan" (floats only); l2_promotion: None (256 bytes), "none", 64, 128 or 256.
    The library checks every limit (InvalidArgumentError naming the field and dimension;
    NotSupportedError before sm_90)."""

    __slots__ = ("_raw", "_map", "_view")

    def __init__(self, view, dims, box, *, strides=None, element_strides=None, swizzle=None,
                 oob_fill="zero", l2_promotion=None):
        if not isinstance(view, View):
            raise TypeError(f"TensorMap() takes a safecuda Buffer or View, not "
                            f"{type(view).__name__}")
        rank = len(tuple(dims))
        if not 1 <= rank <= SC_TENSOR_MAP_MAX_RANK:
            raise ValueError(f"{rank} dimensions: a tensor map has 1 .. "
                             f"{SC_TENSOR_MAP_MAX_RANK}")
        for name, table, value in (("swizzle", _SWIZZLE, swizzle),
                                   ("oob_fill", _OOB_FILL, oob_fill),
                                   ("l2_promotion", _L2, l2_promotion)):
            if value not in table:
                raise ValueError(f"{name}={value!r}: one of {list(table)}")
        d = sc_tensor_map_desc()
        d.rank = rank
        d.swizzle = _SWIZZLE[swizzle]
        d.oob_fill = _OOB_FILL[oob_fill]
        d.l2_promotion = _L2[l2_promotion]
        u64, u32 = (1 << 64) - 1, (1 << 32) - 1
        for i, v in enumerate(_ints("dims", dims, rank, 0, u64)):
            d.dims[i] = v
        for i, v in enumerate(_ints("box", box, rank, 0, u32)):
            d.box[i] = v
        if strides is not None:
            for i, v in enumerate(_ints("strides", strides, rank, 0, u64)):
                d.strides[i] = v
        if element_strides is not None:
            for i, v in enumerate(_ints("element_strides", element_strides, rank, 0, u32)):
                d.element_strides[i] = v
        # The C struct is 64-byte aligned: place it at the first 64-byte boundary.
        self._raw = (c_uint8 * (SC_TENSOR_MAP_BYTES + 63))()
        base = (addressof(self._raw) + 63) & ~63
        self._map = sc_tensor_map.from_address(base)
        _check(lib.sc_tensor_map_encode(view._sv, byref(d), base))
        self._view = view

    @property
    def view(self):
        return self._view

    @property
    def rank(self):
        return self._map.desc.rank

    @property
    def dims(self):
        return tuple(self._map.desc.dims[:self.rank])

    @property
    def box(self):
        return tuple(self._map.desc.box[:self.rank])

    @property
    def encoded(self):
        """The 128 bytes the kernel receives (the driver's CUtensorMap)."""
        return bytes(self._map.encoded)

    @property
    def address(self):
        """The device address the map was encoded for."""
        return self._map.address

    def __repr__(self):
        return (f"<safecuda.TensorMap dims={self.dims} box={self.box} "
                f"{self._view.dtype} of {self._view!r}>")


def _map_arg(kind, name, m):
    if not isinstance(m, TensorMap):
        raise TypeError(f"{name}() takes a safecuda.TensorMap, not {type(m).__name__}")
    a = Arg()
    c = sc_arg(kind, 0, m._map.view)
    c.bytes = addressof(m._map)
    c.size = 128
    a._c = c
    a._keep = m
    a._text = f"{name}({m!r})"
    return a


def TensorMapIn(m):
    """A tensor map whose view the kernel reads (TMA loads): checked and ordered like In."""
    return _map_arg(SC_ARG_TENSOR_MAP_IN, "TensorMapIn", m)


def TensorMapOut(m):
    """A tensor map whose view the kernel writes (TMA stores): checked and ordered like
    Out."""
    return _map_arg(SC_ARG_TENSOR_MAP_OUT, "TensorMapOut", m)
