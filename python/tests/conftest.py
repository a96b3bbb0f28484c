"""The Python tests' plumbing.

The library picks its driver once per process (SAFECUDA_DEVICE, SAFECUDA_LIBCUDA), so the
three kinds of tests run in different processes:

- tests marked `testdevice` run on the test device (libsafecuda_testdevice.so: host memory,
  kernels never run): the first one of a file starts one child pytest over that file's
  testdevice tests with SAFECUDA_DEVICE=test, and each test reports the child's result
  for itself (pass, fail with the child's report, skip with its reason). The marker's
  `env` (a dict, or a callable giving one, called once in this process when the child
  starts) adds to the child's environment: pytest.mark.testdevice(env=...) on a file's
  tests (the first test's is the file's);
- tests marked `gpu` run in this process on the real driver, and skip (saying why) where
  there is no driver, no GPU, or no torch for the torch tests; with SAFECUDA_REQUIRE_GPU=1
  (scripts/gpu-check on a machine with a GPU) those reasons fail the test instead;
- the other tests start their own child processes where they need a driver setting
  (no driver at all, the test device at exit).
"""

import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

import pytest

def _child_env(extra):
    """The environment of a child process: this one's, with the folder this safecuda was
    imported from first on PYTHONPATH (a checkout run with a relative PYTHONPATH too)."""
    import safecuda
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(safecuda.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


INNER = os.environ.get("SAFECUDA_PYTEST_INNER") == "1"
REQUIRE_GPU = os.environ.get("SAFECUDA_REQUIRE_GPU") == "1"
HERE = os.path.dirname(os.path.abspath(__file__))


def pytest_configure(config):
    config.addinivalue_line("markers", "testdevice: runs in a child process on the test "
                            "device (SAFECUDA_DEVICE=test)")
    config.addinivalue_line("markers", "gpu: needs a GPU (the torch tests also torch)")


# ---- the test-device child runs -----------------------------------------------------------

_child_runs = {}


def _child_results(path, extra_env=None):
    key = str(path)
    if key in _child_runs:
        return _child_runs[key]
    fd, xml = tempfile.mkstemp(suffix=".xml", prefix="safecuda-testdevice-")
    os.close(fd)
    extra = extra_env() if callable(extra_env) else dict(extra_env or {})
    env = _child_env({"SAFECUDA_DEVICE": "test", "SAFECUDA_PYTEST_INNER": "1", **extra})
    env.pop("SAFECUDA_LIBCUDA", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "testdevice",
           f"--junitxml={xml}", "-o", "junit_family=xunit1", key]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900,
                              cwd=HERE)
        output = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        output = f"the child pytest timed out after {exc.timeout} s"
    results = {}
    try:
        for case in ET.parse(xml).getroot().iter("testcase"):
            name = case.get("name")
            outcome, text = "passed", ""
            for child in case:
                if child.tag in ("failure", "error"):
                    outcome = "failed"
                    text += (child.get("message") or "") + "\n" + (child.text or "")
                elif child.tag == "skipped":
                    outcome = "skipped"
                    text = child.get("message") or ""
            if outcome == "passed" or name not in results:
                results[name] = (outcome, text)
            elif outcome == "failed":
                results[name] = (outcome, results[name][1] + "\n" + text)
    except (ET.ParseError, FileNotFoundError):
        pass
    finally:
        try:
            os.unlink(xml)
        except OSError:
            pass
    _child_runs[key] = (results, output)
    return _child_runs[key]


class ChildResult(pytest.Item):
    """A testdevice test seen from the parent process: its outcome is the child's."""

    def __init__(self, *, test_path, **kw):
        super().__init__(**kw)
        self.test_path = test_path

    def runtest(self):
        marker = self.get_closest_marker("testdevice")
        env = marker.kwargs.get("env") if marker is not None else None
        results, output = _child_results(self.test_path, env)
        r = results.get(self.name)
        if r is None:
            pytest.fail(f"the test-device child run gave no result for {self.name}; its "
                        f"output:\n{output[-6000:]}", pytrace=False)
        outcome, text = r
        if outcome == "skipped":
            pytest.skip(text)
        if outcome == "failed":
            pytest.fail(f"failed on the test device (child process, SAFECUDA_DEVICE=test):"
                        f"\n{text}", pytrace=False)

    def reportinfo(self):
        return self.path, None, f"{self.name} (on the test device, in a child process)"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    if INNER:
        return
    for i, item in enumerate(items):
        if item.get_closest_marker("testdevice") is None:
            continue
        child = ChildResult.from_parent(item.parent, name=item.name, test_path=item.path)
        for m in item.iter_markers():
            child.own_markers.append(m)
        items[i] = child


# ---- skips that a GPU machine must not take -------------------------------------------------


def gpu_skip(reason):
    """Skip, or fail under SAFECUDA_REQUIRE_GPU=1 (a machine with a GPU)."""
    if REQUIRE_GPU:
        pytest.fail(f"SAFECUDA_REQUIRE_GPU=1 but: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def gpu():
    """The device ordinal 0 of a real GPU, or a skip saying why there is none."""
    import safecuda as sc
    try:
        n = sc.device_count()
    except sc.SafecudaError as exc:
        msg = exc.message if len(exc.message) <= 160 else exc.message[:157] + "..."
        gpu_skip(f"no usable CUDA driver ({exc.status.name}): {msg}")
    if n == 0:
        gpu_skip("the CUDA driver sees no GPU")
    if "testdevice" in sc.driver_path():
        gpu_skip("SAFECUDA_DEVICE=test: the test device runs no kernels")
    return 0


@pytest.fixture(scope="session")
def torch_cuda(gpu):
    """torch, with CUDA, or a skip saying why not."""
    try:
        import torch
    except ImportError as exc:
        gpu_skip(f"torch is not installed ({exc})")
    if not torch.cuda.is_available():
        gpu_skip("torch.cuda.is_available() is False")
    return torch


@pytest.fixture(scope="session")
def nvrtc():
    """NVRTC's version, or a skip (a failure under SAFECUDA_REQUIRE_GPU=1)."""
    import safecuda as sc
    try:
        return sc.compiler_version()
    except sc.NoCompilerError as exc:
        gpu_skip(f"no NVRTC (pip install nvidia-cuda-nvrtc, or a CUDA toolkit): {exc.message}")


def run_python(code, env_extra=None, timeout=300, drop=()):
    """Run code in a child Python; (returncode, stdout, stderr)."""
    env = _child_env(env_extra or {})
    for k in ("SAFECUDA_PYTEST_INNER", *drop):
        if k not in (env_extra or {}):
            env.pop(k, None)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=HERE)
    return proc.returncode, proc.stdout, proc.stderr
