"""NVRTC from NVIDIA's pip wheels.

The C library looks for NVRTC by name (the dynamic linker's folders), under $CUDA_HOME,
$CUDA_PATH and the usual toolkit folders, or exactly where SAFECUDA_NVRTC points. A pip
install of NVRTC puts it where none of those look:

    nvidia-cuda-nvrtc        (CUDA 13)  site-packages/nvidia/cu13/lib/libnvrtc.so.13
    nvidia-cuda-nvrtc-cu12   (CUDA 12)  site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12

so when SAFECUDA_NVRTC is not set and one of these is installed, the package sets it to
that file (the newer first) before the library first loads NVRTC.
"""

import os
import sys

WHEEL_LIBRARIES = (
    ("cu13", "lib", "libnvrtc.so.13"),
    ("cuda_nvrtc", "lib", "libnvrtc.so.12"),
)


def _nvidia_dirs(paths):
    seen = set()
    for entry in paths:
        if not entry:
            continue
        d = os.path.join(entry, "nvidia")
        if d not in seen and os.path.isdir(d):
            seen.add(d)
            yield d


def find_wheel_nvrtc(paths=None):
    """The libnvrtc of an installed NVIDIA wheel under the given import paths (default:
    sys.path), None when there is none."""
    dirs = list(_nvidia_dirs(sys.path if paths is None else paths))
    for parts in WHEEL_LIBRARIES:
        for d in dirs:
            p = os.path.join(d, *parts)
            if os.path.isfile(p):
                return p
    return None


def setup_nvrtc(environ=None, paths=None):
    """Point SAFECUDA_NVRTC at a wheel's NVRTC unless it is set; returns what it set (or
    None)."""
    env = os.environ if environ is None else environ
    if env.get("SAFECUDA_NVRTC"):
        return None
    p = find_wheel_nvrtc(paths)
    if p:
        env["SAFECUDA_NVRTC"] = p
    return p
