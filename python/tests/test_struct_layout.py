"""The ctypes structures of the MoE and quantization APIs against the C headers: the library reads the whole
struct it is given, so a Python struct with a field missing, out of order or of another
size hands it garbage in the fields after it.

Two checks: the layout computed here from the header's own field list (the x86-64 / aarch64
LP64 rules: each field at the next multiple of its alignment, the size a multiple of the
largest), which needs nothing but the header; and, where a C compiler is at hand, a small C
program that prints the real sizeof and offsetof of every field."""

import ctypes
import os
import re
import shutil
import subprocess
import tempfile

import pytest

from safecuda import _lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INCLUDE = os.path.join(ROOT, "include")
HEADERS = [os.path.join(INCLUDE, "safecuda.h"), os.path.join(INCLUDE, "safecuda", "moe.h"),
           os.path.join(INCLUDE, "safecuda", "quant.h"),
           os.path.join(INCLUDE, "safecuda", "comm.h")]

# The structs checked: (C name, header, ctypes class).
STRUCTS = [
    ("sc_view", "safecuda.h", _lib.sc_view),
    ("sc_moe_desc", "moe.h", _lib.sc_moe_desc),
    ("sc_moe_profile", "moe.h", _lib.sc_moe_profile),
    ("sc_moe_forward_desc", "moe.h", _lib.sc_moe_forward_desc),
    ("sc_tensor_map_desc", "safecuda.h", _lib.sc_tensor_map_desc),
    ("sc_quant_desc", "quant.h", _lib.sc_quant_desc),
    ("sc_comm_id", "comm.h", _lib.sc_comm_id),
    ("sc_comm_desc", "comm.h", _lib.sc_comm_desc),
    ("sc_comm_all_desc", "comm.h", _lib.sc_comm_all_desc),
    ("sc_comm_props", "comm.h", _lib.sc_comm_props),
]

# Sizes and alignments of the C types these structs use (LP64; enums are int-sized).
SCALARS = {"char": (1, 1), "unsigned char": (1, 1), "int": (4, 4), "float": (4, 4),
           "bool": (1, 1), "uint64_t": (8, 8),
           "uint32_t": (4, 4), "int64_t": (8, 8), "double": (8, 8)}
ENUMS = {"sc_dtype", "sc_moe_scoring", "sc_moe_backend", "sc_moe_activation",
         "sc_moe_w13_layout", "sc_moe_tp_output", "sc_moe_ep_mode", "sc_tensor_swizzle", "sc_tensor_oob_fill",
         "sc_tensor_l2_promotion"}
HANDLES = {"sc_buffer", "sc_context", "sc_stream", "sc_moe", "sc_comm"}  # struct { uint64_t id; }


def _header_text(name):
    path = next((p for p in HEADERS if os.path.basename(p) == name), None)
    if path is None or not os.path.exists(path):
        pytest.skip(f"the C headers are not beside the tests ({path}): run the tests from a "
                    f"safecuda checkout")
    with open(path) as f:
        return f.read()


def _strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def _defines():
    out = {}
    for p in HEADERS:
        if os.path.exists(p):
            with open(p) as f:
                for name, value in re.findall(r"#define\s+(\w+)\s+(\d+)\b", f.read()):
                    out[name] = int(value)
    return out


def header_fields(struct, header):
    """[(name, C type, array length or None, is pointer)] of `typedef struct struct {...}`."""
    text = _strip_comments(_header_text(header))
    m = re.search(r"typedef\s+struct\s+" + struct + r"\s*\{(.*?)\}\s*" + struct + r"\s*;",
                  text, flags=re.S)
    assert m, f"typedef struct {struct} not found in {header}"
    defines = _defines()
    fields = []
    for decl in m.group(1).split(";"):
        decl = " ".join(decl.split())
        if not decl:
            continue
        dm = re.match(r"((?:const\s+)?(?:unsigned\s+)?\w+)\s+(.*)$", decl)
        assert dm, f"{struct}: can't read the declaration {decl!r}"
        ctype = dm.group(1).replace("const ", "")
        for item in dm.group(2).split(","):
            item = item.strip()
            pointer = item.startswith("*")
            item = item.lstrip("*").strip()
            am = re.match(r"(\w+)\s*(?:\[\s*(\w+)\s*\])?$", item)
            assert am, f"{struct}: can't read {item!r} in {decl!r}"
            n = am.group(2)
            length = None if n is None else (int(n) if n.isdigit() else defines[n])
            fields.append((am.group(1), ctype, length, pointer))
    return fields


def c_layout(struct, header, known):
    """(sizeof, align, {field: offset}) by the LP64 rules, from the header's field list;
    known: the layouts of structs already computed (a struct inside another)."""
    offset, align_max, offsets = 0, 1, {}
    for name, ctype, length, pointer in header_fields(struct, header):
        if pointer:
            size, align = 8, 8
        elif ctype in SCALARS:
            size, align = SCALARS[ctype]
        elif ctype in ENUMS:
            size, align = 4, 4
        elif ctype in HANDLES:
            size, align = 8, 8
        elif ctype in known:
            size, align = known[ctype][0], known[ctype][1]
        else:
            raise AssertionError(f"{struct}.{name}: the test does not know C type {ctype}")
        if length is not None:
            size *= length
        offset = (offset + align - 1) // align * align
        offsets[name] = offset
        offset += size
        align_max = max(align_max, align)
    size = (offset + align_max - 1) // align_max * align_max
    return size, align_max, offsets


@pytest.fixture(scope="module")
def layouts():
    known = {}
    for struct, header, _ in STRUCTS:
        known[struct] = c_layout(struct, header, known)
    return known


@pytest.mark.parametrize("struct,header,cls", STRUCTS, ids=[s[0] for s in STRUCTS])
def test_fields_in_the_header_order(struct, header, cls):
    names = [f[0] for f in header_fields(struct, header)]
    assert [f[0] for f in cls._fields_] == names, (
        f"{cls.__name__}._fields_ in python/safecuda/_lib.py must list the fields of {struct} "
        f"({header}) in its order")


@pytest.mark.parametrize("struct,header,cls", STRUCTS, ids=[s[0] for s in STRUCTS])
def test_size_and_offsets_match_the_header(struct, header, cls, layouts):
    if ctypes.sizeof(ctypes.c_void_p) != 8:
        pytest.skip("the layout rules here are LP64's")
    size, align, offsets = layouts[struct]
    assert ctypes.sizeof(cls) == size, f"sizeof({struct}): ctypes {ctypes.sizeof(cls)}, C {size}"
    assert ctypes.alignment(cls) == align
    for name, _ in cls._fields_:
        assert getattr(cls, name).offset == offsets[name], (
            f"offsetof({struct}, {name}): ctypes {getattr(cls, name).offset}, C "
            f"{offsets[name]}")


def test_moe_desc_size_as_the_header_declares_it(layouts):
    # The desc: 14 v1 fields, then routing, experts, 4 weight views, 3 biases, the shared
    # expert (ending at 360), then the fp8 experts' dtype (at 360) and 4 scale views (368,
    # 392, 416, 440), then the tensor-parallel communicator (at 464) and output (472), then
    # the expert-parallel communicator (480), mode (488), packet rows (492) and owner map
    # (496): 504 bytes on LP64 (a short Python struct would end at the v1 88, the v2 360,
    # the fp8 464, the first TP 472 or the TP 480, and the library would read past it).
    assert layouts["sc_moe_desc"][0] == 504
    assert ctypes.sizeof(_lib.sc_moe_desc) == 504
    assert layouts["sc_moe_desc"][2]["tp_comm"] == 464
    assert layouts["sc_moe_desc"][2]["ep_comm"] == 480
    assert layouts["sc_moe_desc"][2]["ep_owner"] == 496
    assert layouts["sc_moe_desc"][2]["tp_output"] == 472
    offsets = layouts["sc_moe_desc"][2]
    assert [offsets[f] for f in ("expert_dtype", "w13_scale", "w2_scale", "shared_w13_scale",
                                 "shared_w2_scale")] == [360, 368, 392, 416, 440]
    assert [getattr(_lib.sc_moe_desc, f).offset
            for f in ("expert_dtype", "w13_scale", "w2_scale", "shared_w13_scale",
                      "shared_w2_scale")] == [360, 368, 392, 416, 440]
    assert ctypes.sizeof(_lib.sc_moe_forward_desc) == 112


def test_tensor_map_desc_as_the_header_declares_it(layouts):
    # The 2-D fields first (40 bytes, as before the general form), then rank, dims, strides,
    # box, element strides, the fill and the L2 promotion.
    size, _, offsets = layouts["sc_tensor_map_desc"]
    assert size == 176 and offsets["rank"] == 40 and offsets["dims"] == 48
    assert offsets["l2_promotion"] == 172
    # sc_tensor_map: 64-byte aligned in C (its encoded bytes are the CUtensorMap), which
    # ctypes can't say: _tensor_map.py places it by hand; the C size rounds up to 64.
    m = _lib.sc_tensor_map
    assert m.encoded.offset == 0 and m.view.offset == 128 and m.address.offset == 152
    assert m.desc.offset == 160 and _lib.SC_TENSOR_MAP_BYTES == 384


def test_layout_compiled_by_a_c_compiler():
    """sizeof and offsetof from a C compiler over the real header (skipped without one)."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or \
        shutil.which("clang")
    if not cc:
        pytest.skip("no C compiler (cc, gcc, clang) on PATH")
    for p in HEADERS:
        if not os.path.exists(p):
            pytest.skip(f"the C headers are not beside the tests ({p})")
    lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "safecuda/moe.h"',
             '#include "safecuda/quant.h"', '#include "safecuda/comm.h"',
             "int main(void) {"]
    for struct, _, cls in STRUCTS + [("sc_tensor_map", "safecuda.h", _lib.sc_tensor_map)]:
        lines.append(f'    printf("{struct} sizeof %zu\\n", sizeof({struct}));')
        for name, _ in cls._fields_:
            lines.append(f'    printf("{struct} {name} %zu\\n", offsetof({struct}, {name}));')
    lines.append('    printf("sc_tensor_map alignof %zu\\n", _Alignof(sc_tensor_map));')
    lines += ["    return 0;", "}"]
    with tempfile.TemporaryDirectory(prefix="safecuda-layout-") as d:
        src, exe = os.path.join(d, "layout.c"), os.path.join(d, "layout")
        with open(src, "w") as f:
            f.write("\n".join(lines) + "\n")
        proc = subprocess.run([cc, "-std=c11", "-I", INCLUDE, src, "-o", exe],
                              capture_output=True, text=True)
        assert proc.returncode == 0, (
            f"the layout program did not compile (a ctypes field the header lacks?):\n"
            f"{proc.stderr[-3000:]}")
        out = subprocess.run([exe], capture_output=True, text=True, check=True).stdout
    got = {}
    for line in out.splitlines():
        struct, name, value = line.split()
        got[(struct, name)] = int(value)
    # sc_tensor_map: the fields where ctypes has them, the size and alignment C's.
    assert got[("sc_tensor_map", "sizeof")] == _lib.SC_TENSOR_MAP_BYTES
    assert got[("sc_tensor_map", "alignof")] == 64
    for name, _ in _lib.sc_tensor_map._fields_:
        assert getattr(_lib.sc_tensor_map, name).offset == got[("sc_tensor_map", name)]
    for struct, _, cls in STRUCTS:
        assert ctypes.sizeof(cls) == got[(struct, "sizeof")], (
            f"sizeof({struct}): ctypes {ctypes.sizeof(cls)}, C {got[(struct, 'sizeof')]}")
        for name, _ in cls._fields_:
            assert getattr(cls, name).offset == got[(struct, name)], (
                f"offsetof({struct}, {name}): ctypes {getattr(cls, name).offset}, C "
                f"{got[(struct, name)]}")
