"""The package without a GPU: import, the no-driver error, statuses and exceptions, NVRTC
from wheels, leak reports and interpreter exit (child processes)."""

import os
import sys
import textwrap

import pytest

import safecuda as sc
from conftest import run_python

NO_DRIVER = {"SAFECUDA_LIBCUDA": "/nonexistent/libcuda.so.1"}


def test_import_needs_no_driver_gpu_or_torch():
    rc, out, err = run_python(textwrap.dedent("""
        import sys
        import safecuda
        assert "torch" not in sys.modules, "import safecuda imported torch"
        assert "numpy" not in sys.modules, "import safecuda imported numpy"
        print(safecuda.version(), safecuda.__version__)
    """), NO_DRIVER, drop=("SAFECUDA_DEVICE",))
    assert rc == 0, err
    assert out.split() == ["0.1.0", "0.1.0"]


def test_torch_module_without_torch_says_it_needs_pytorch():
    """import safecuda.torch where torch can't be imported: an ImportError saying that the
    module needs PyTorch and how to install it, not a bare ModuleNotFoundError; safecuda
    itself still works."""
    rc, out, err = run_python(textwrap.dedent("""
        import sys
        sys.modules["torch"] = None  # torch can't be imported
        import safecuda
        try:
            import safecuda.torch
        except ImportError as e:
            assert isinstance(e, ModuleNotFoundError) and e.name == "torch", repr(e)
            assert e.__cause__ is None and e.__suppress_context__, "a chained traceback"
            print("MESSAGE", e)
        else:
            raise AssertionError("import safecuda.torch worked without torch")
        print("VERSION", safecuda.version())
    """), NO_DRIVER, drop=("SAFECUDA_DEVICE",))
    assert rc == 0, err
    msg = out.split("MESSAGE ", 1)[1].split("\n", 1)[0]
    assert msg.startswith("safecuda.torch needs PyTorch (torch >= 2.4), which is not "
                          "installed: pip install torch"), msg
    assert "import safecuda (without .torch) needs no torch" in msg
    assert "VERSION 0.1.0" in out


def test_first_call_without_driver_raises_no_driver():
    rc, out, err = run_python(textwrap.dedent("""
        import safecuda as sc
        for call in (lambda: sc.Context(), sc.device_count, sc.init):
            try:
                call()
            except sc.NoDriverError as e:
                assert isinstance(e, sc.SafecudaError)
                assert e.status == sc.Status.SC_ERR_NO_DRIVER and int(e.status) == 2
                assert e.status.name == "SC_ERR_NO_DRIVER"
                print("MESSAGE", e.message)
                print("STR", str(e))
            else:
                raise SystemExit("no exception")
    """), NO_DRIVER, drop=("SAFECUDA_DEVICE",))
    assert rc == 0, err
    lines = out.splitlines()
    messages = [ln for ln in lines if ln.startswith("MESSAGE ")]
    assert len(messages) == 3
    assert "sc_context_create: cannot load the CUDA driver library from " \
           "SAFECUDA_LIBCUDA=/nonexistent/libcuda.so.1" in messages[0]
    assert "install the NVIDIA driver" in messages[0]
    assert any(ln.startswith("STR SC_ERR_NO_DRIVER: sc_context_create: cannot load")
               for ln in lines)


def test_unknown_device_setting_is_invalid_argument():
    rc, out, err = run_python(textwrap.dedent("""
        import safecuda as sc
        try:
            sc.Context()
        except sc.InvalidArgumentError as e:
            assert isinstance(e, ValueError)
            print(e.message)
    """), {"SAFECUDA_DEVICE": "nonsense"}, drop=("SAFECUDA_LIBCUDA",))
    assert rc == 0, err
    assert "SAFECUDA_DEVICE=nonsense is not a device safecuda knows" in out


def test_statuses_match_the_library():
    for s in sc.Status:
        assert sc.status_name(s) == s.name
    assert sc.status_name(len(sc.Status)) == "SC_STATUS_UNKNOWN"


def test_one_exception_class_per_status():
    names = {
        "SC_ERR_STALE_HANDLE": "StaleHandleError", "SC_ERR_NO_DRIVER": "NoDriverError",
        "SC_ERR_TYPE_MISMATCH": "TypeMismatchError", "SC_ERR_OUT_OF_BOUNDS": "OutOfBoundsError",
        "SC_ERR_CAPTURE_INVALIDATED": "CaptureInvalidatedError",
        "SC_ERR_HOST_OUT_OF_MEMORY": "HostOutOfMemoryError", "SC_ERR_LEAKED": "LeakedError",
    }
    for status, cls_name in names.items():
        cls = getattr(sc, cls_name)
        assert issubclass(cls, sc.SafecudaError)
        e = cls(sc.Status[status], "msg")
        assert e.status.name == status and e.message == "msg"
        assert str(e) == f"{status}: msg"
    for s in sc.Status:
        if s != sc.Status.SC_OK:
            assert issubclass(sc.ERROR_CLASSES[int(s)], sc.SafecudaError)
    # Pythonic bases where one fits.
    assert issubclass(sc.InvalidArgumentError, ValueError)
    assert issubclass(sc.TypeMismatchError, TypeError)
    assert issubclass(sc.OutOfBoundsError, IndexError)
    assert issubclass(sc.OutOfMemoryError, MemoryError)
    assert issubclass(sc.OverflowError, OverflowError)
    assert "OverflowError" not in sc.__all__  # a star import keeps the builtin
    assert issubclass(sc.TimeoutError, TimeoutError)
    assert "TimeoutError" not in sc.__all__


def test_exceptions_pickle():
    import pickle
    e = pickle.loads(pickle.dumps(sc.StaleHandleError(sc.Status.SC_ERR_STALE_HANDLE, "m")))
    assert type(e) is sc.StaleHandleError and e.status == sc.Status.SC_ERR_STALE_HANDLE


def test_missing_symbol_is_reported_by_name():
    lib = sc._lib.lib
    sc._lib.SIGNATURES["sc_no_such_function"] = (None, [])
    try:
        assert not lib.has("sc_no_such_function")
        with pytest.raises(sc.MissingSymbolError) as info:
            lib.sc_no_such_function()
        assert "sc_no_such_function is not in" in str(info.value)
    finally:
        del sc._lib.SIGNATURES["sc_no_such_function"]


def test_version_and_library_location():
    assert sc.version() == sc.__version__
    path = sc.library_path()
    assert os.path.exists(path)
    if not os.environ.get("SAFECUDA_LIBRARY"):
        # The test device is installed beside the library (it is looked for there).
        assert os.path.exists(os.path.join(os.path.dirname(path),
                                           "libsafecuda_testdevice.so"))


def test_dtypes():
    assert sc.as_dtype("f32") is sc.DType.F32
    assert sc.as_dtype("bfloat16") is sc.DType.BF16
    assert sc.as_dtype(sc.DType.I64) is sc.DType.I64
    assert sc.as_dtype("torch.int32") is sc.DType.I32
    with pytest.raises(ValueError, match="unknown dtype 'complex64'"):
        sc.as_dtype("complex64")
    for d in sc.DType:
        assert d.size == sc._lib.lib.sc_dtype_size(int(d))
        assert d.short_name == sc._lib.lib.sc_dtype_name(int(d)).decode()


def test_fp8_dtypes():
    E4, E5 = sc.DType.F8E4M3, sc.DType.F8E5M2
    assert (int(E4), int(E5)) == (13, 14)
    for name in ("f8e4m3", "F8E4M3", "float8_e4m3fn", "float8_e4m3", "torch.float8_e4m3fn", 13,
                 E4):
        assert sc.as_dtype(name) is E4
    for name in ("f8e5m2", "float8_e5m2", "torch.float8_e5m2", 14):
        assert sc.as_dtype(name) is E5
    for d in (E4, E5):
        assert d.size == 1 and d.format == "B" and d.kind == "f"
    assert str(E4) == "f8e4m3" and str(E5) == "f8e5m2"
    with pytest.raises(ValueError, match="unknown dtype 'float8_e4m3fnuz'"):
        sc.as_dtype("float8_e4m3fnuz")
    # Host data of fp8 buffers is raw bits: only 1-byte raw formats go there.
    from safecuda._dtype import dtype_for_host_format, host_compatible
    assert host_compatible("B", E4) and host_compatible("b", E5)
    assert not host_compatible("f", E4) and not host_compatible("e", E5)
    assert dtype_for_host_format("B") is sc.DType.U8


def test_fp8_conversions():
    import math
    from safecuda._dtype import float_to_fp8_bits as enc
    from safecuda._dtype import fp8_bits_to_float as dec
    E4, E5 = "f8e4m3", "f8e5m2"
    # Known patterns: 1.0, 2.0, -0.5, the largest finite, the smallest subnormal, NaN, inf.
    assert (dec(0x38, E4), dec(0x40, E4), dec(0xB0, E4)) == (1.0, 2.0, -0.5)
    assert (dec(0x3C, E5), dec(0x40, E5), dec(0xB8, E5)) == (1.0, 2.0, -0.5)
    assert dec(0x7E, E4) == 448.0 and dec(0x7B, E5) == 57344.0
    assert dec(0x01, E4) == 2.0 ** -9 and dec(0x01, E5) == 2.0 ** -16
    assert math.isnan(dec(0x7F, E4)) and math.isnan(dec(0xFF, E4))
    assert dec(0x7C, E5) == math.inf and dec(0xFC, E5) == -math.inf
    assert math.isnan(dec(0x7D, E5)) and math.isnan(dec(0xFF, E5))
    assert dec(0x78, E4) == 256.0  # e4m3 has no infinities: S.1111.000 is a number
    # Every finite pattern round-trips; infinities saturate to the largest finite value.
    for fmt, top in ((E4, 0x7E), (E5, 0x7B)):
        for b in range(256):
            v = dec(b, fmt)
            if math.isnan(v):
                continue
            want = (b & 0x80) | top if math.isinf(v) else b
            assert enc(v, fmt) == want, (fmt, hex(b))
    # Round to nearest, ties to even; saturation; signed zero; NaN.
    assert enc(1.0625, E4) == 0x38  # halfway between 1.0 (even) and 1.125
    assert enc(1.1875, E4) == 0x3A  # halfway between 1.125 and 1.25 (even)
    assert enc(1.07, E4) == 0x39
    assert enc(1.125, E5) == 0x3C and enc(1.375, E5) == 0x3E  # ties to even in e5m2
    assert enc(2.0 ** -10, E4) == 0x00 and enc(1.5 * 2.0 ** -10, E4) == 0x01
    assert enc(3 * 2.0 ** -10, E4) == 0x02  # 1.5 subnormal steps: to even
    assert enc(460.0, E4) == 0x7E and enc(1e9, E4) == 0x7E and enc(-math.inf, E4) == 0xFE
    assert enc(1e9, E5) == 0x7B and enc(math.inf, E5) == 0x7B
    assert enc(-0.0, E4) == 0x80 and enc(0.0, E5) == 0x00 and enc(-1e-30, E5) == 0x80
    assert enc(math.nan, E4) == 0x7F and enc(math.nan, E5) == 0x7F
    with pytest.raises(ValueError, match="not an fp8 dtype"):
        enc(1.0, "bf16")
    from safecuda._dtype import pack_scalar
    assert pack_scalar(sc.DType.F8E4M3, 1.0) == b"\x38"
    assert pack_scalar(sc.DType.F8E5M2, -2) == b"\xc0"
    assert pack_scalar(sc.DType.F8E4M3, b"\xff") == b"\xff"  # raw bits
    with pytest.raises(ValueError, match="2 bytes for f8e5m2"):
        pack_scalar(sc.DType.F8E5M2, b"\x00\x01")


def test_bf16_rounding():
    from safecuda._dtype import bf16_bits_to_float, float_to_bf16_bits
    assert float_to_bf16_bits(1.0) == 0x3F80
    assert float_to_bf16_bits(-2.5) == 0xC020
    assert bf16_bits_to_float(float_to_bf16_bits(3.140625)) == 3.140625
    assert float_to_bf16_bits(1.0 + 2 ** -8) == 0x3F80  # a tie rounds to even
    assert float_to_bf16_bits(float("nan")) == 0x7FC0


def test_scalar_arguments_are_range_checked():
    assert repr(sc.i32(3)) == "i32(3)"
    with pytest.raises(OverflowError):
        sc.i32(1 << 31)
    with pytest.raises(OverflowError):
        sc.u64(-1)
    assert repr(sc.f32(1.5)) == "f32(1.5)"
    with pytest.raises(TypeError, match="In\\(\\) takes a safecuda Buffer or View"):
        sc.In(b"bytes")


def test_nvrtc_wheel_locations(tmp_path):
    from safecuda._nvrtc import find_wheel_nvrtc, setup_nvrtc
    site = tmp_path / "site-packages"
    assert find_wheel_nvrtc([str(site)]) is None
    cu12 = site / "nvidia" / "cuda_nvrtc" / "lib"
    cu12.mkdir(parents=True)
    (cu12 / "libnvrtc.so.12").write_bytes(b"")
    assert find_wheel_nvrtc([str(site)]) == str(cu12 / "libnvrtc.so.12")
    cu13 = site / "nvidia" / "cu13" / "lib"
    cu13.mkdir(parents=True)
    (cu13 / "libnvrtc.so.13").write_bytes(b"")
    assert find_wheel_nvrtc([str(site)]) == str(cu13 / "libnvrtc.so.13")  # the newer first
    env = {}
    assert setup_nvrtc(env, [str(site)]) == str(cu13 / "libnvrtc.so.13")
    assert env["SAFECUDA_NVRTC"] == str(cu13 / "libnvrtc.so.13")
    env = {"SAFECUDA_NVRTC": "/mine/libnvrtc.so"}
    assert setup_nvrtc(env, [str(site)]) is None  # a set variable is the user's
    assert env["SAFECUDA_NVRTC"] == "/mine/libnvrtc.so"


def test_installed_nvrtc_wheel_is_used():
    from safecuda._nvrtc import find_wheel_nvrtc
    wheel = find_wheel_nvrtc()
    if wheel is None:
        pytest.skip("no NVRTC wheel installed (pip install nvidia-cuda-nvrtc)")
    rc, out, err = run_python("import safecuda as sc; print(sc.compiler_path()); "
                              "print(sc.compiler_version())", drop=("SAFECUDA_NVRTC",))
    assert rc == 0, err
    assert os.path.realpath(out.splitlines()[0]) == os.path.realpath(wheel)


# ---- leaks and exit, on the test device, in child processes --------------------------------

TESTDEVICE = {"SAFECUDA_DEVICE": "test"}


def test_garbage_collected_objects_are_reported():
    rc, out, err = run_python(textwrap.dedent("""
        import gc
        import safecuda as sc
        ctx = sc.Context()
        b = ctx.buffer(8, "f32", label="forgotten")
        line = b._site[1]
        del b
        gc.collect()
        print("LINE", line)
        s = ctx.stream(label="lost stream")
        del s
        kept = ctx.buffer(4, "i32", label="kept")
        ctx.close()   # the library reports what is still open in the context
        try:
            kept.tolist()
        except sc.StaleHandleError as e:
            print("STALE", e.message)
    """), TESTDEVICE, drop=("SAFECUDA_LIBCUDA",))
    assert rc == 0, err
    line = [ln for ln in out.splitlines() if ln.startswith("LINE ")][0].split()[1]
    assert (f"safecuda warning: garbage collector: buffer 'forgotten' 8 x f32 created at "
            f"<string>:{line} was not closed; destroyed now") in err
    assert "garbage collector: stream 'lost stream'" in err
    # The library's own report at the context's destroy, naming the Python creation site.
    assert "sc_context_destroy: context on device 0 (created at <string>:4) has 1 live " \
           "object" in err
    assert "buffer 'kept' 4 x i32, 16 bytes, created at <string>:" in err
    assert "STALE sc_copy_to_host: stale buffer handle: the buffer created at <string>:" in out


EXIT_SCRIPT = textwrap.dedent("""
    import array, gc, sys
    import safecuda as sc
    ctx = sc.Context()
    a = ctx.from_host(array.array("f", range(64)), label="a")
    v = a[8:16]
    s = ctx.stream(label="s")
    e = ctx.event(label="e")
    b = ctx.buffer((4, 4), "bf16", label="b", zero=True)
    cycle = [ctx, a]
    cycle.append(cycle)           # objects only a cycle holds
    other = sc.Context()
    lone = other.buffer(16, "u8", label="outlives its context")
    other.close()                 # the buffer's Python object outlives its context
    d = sc.default_context(0).buffer(3, "i64", label="in the default context")
    ctx2 = sc.Context()
    left = ctx2.buffer(3, "f64", label="left open")
    EXTRA
    print("done")
""")


def test_exit_with_live_objects_does_not_crash():
    rc, out, err = run_python(EXIT_SCRIPT.replace("EXTRA", ""), TESTDEVICE,
                              drop=("SAFECUDA_LIBCUDA",))
    assert rc == 0, err
    assert out.strip() == "done"
    assert "Traceback" not in err and "Exception ignored" not in err, err
    # other.close() reported its open buffer; at exit what is still open is closed quietly.
    assert "buffer 'outlives its context' 16 x u8" in err
    assert "left open" not in err and "in the default context" not in err, err
    assert "garbage collector" not in err, err


def test_exit_with_dlpack_capsules_and_borrowed_buffers():
    extra = textwrap.dedent("""
        cap = a.__dlpack__(max_version=(1, 1))          # never consumed
        legacy = b.__dlpack__()                         # unversioned, never consumed
        borrowed = sc.Buffer.from_dlpack(a, context=ctx)  # borrows a's memory
        held = [a.__dlpack__(max_version=(1, 1)) for _ in range(3)]
        sc.set_log_callback(lambda level, msg: None)
    """)
    code = EXIT_SCRIPT.replace("EXTRA", extra)
    if not sc._lib.lib.has("sc_view_to_dlpack_at"):
        pytest.fail("this libsafecuda has no DLPack export (sc_view_to_dlpack_at): the "
                    "interop API is not built in")
    rc, out, err = run_python(code, TESTDEVICE, drop=("SAFECUDA_LIBCUDA",))
    assert rc == 0, err
    assert out.strip() == "done"
    assert "Traceback" not in err and "Exception ignored" not in err, err


def test_exit_from_a_thread_still_running_a_stream():
    rc, out, err = run_python(textwrap.dedent("""
        import threading
        import safecuda as sc
        ctx = sc.Context()
        s = ctx.stream()
        b = ctx.buffer(1 << 16, "f32")
        def work():
            for _ in range(200):
                b.fill(1.0, stream=s)
        t = threading.Thread(target=work)
        t.start()
        t.join()
        print("done")
    """), TESTDEVICE, drop=("SAFECUDA_LIBCUDA",))
    assert rc == 0, err
    assert "Traceback" not in err


def test_import_from_checkout_or_install_is_this_package():
    assert sc.__file__.startswith(os.path.dirname(sc._lib.PACKAGE_DIR))
    assert sys.modules["safecuda"] is sc


def test_transformers_comparison_skips_without_torch():
    """tests/gpu/moe_transformers.py (run by scripts/gpu-check) says why it skips, with exit
    status 77, where torch is missing. torch is hidden from the script (None in sys.modules),
    so this runs, and checks the same thing, whether torch is installed or not."""
    import subprocess
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), "tests", "gpu", "moe_transformers.py")
    if not os.path.exists(script):
        pytest.skip(f"{script} is not beside the tests (run them from a checkout)")
    hide = ("import runpy, sys; sys.modules['torch'] = None; sys.argv = [sys.argv[1]]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", hide, script], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 77, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1].startswith(
        "moe_transformers: skipped: torch is not installed"), proc.stdout
