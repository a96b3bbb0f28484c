"""The timing harness of the torch peers (torch_add, torch_copy, torch_ops, torch_moe).

One place for what the four share: loading torch and device 0 (or the reason there is no
peer: a message on stderr and the exit status the benchmarks report), the "# torch ..."
information line, and timing with torch.cuda.Event pairs.

    torch, dev, status = _harness.open_device()
    if status:
        return status
    print(f"# {_harness.describe(torch, dev)}", flush=True)
    timer = _harness.EventTimer(torch, stream)     # stream None: the current stream
    ms = timer.median_ms(fn, runs=50, warmup=5)
"""
import statistics
import sys

# Exit statuses: the benchmarks print "peer: unavailable (exit N: <last line>)".
NO_TORCH = 2  # torch can't be imported
NO_CUDA = 3   # torch.cuda.is_available() is False


def open_device():
    """(torch, device 0, 0) with device 0 made current, or (None, None, status) after saying
    why on stderr."""
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - any import failure means "no peer"
        print(f"torch unavailable: {exc}", file=sys.stderr)
        return None, None, NO_TORCH
    if not torch.cuda.is_available():
        print("torch unavailable: torch.cuda.is_available() is False", file=sys.stderr)
        return None, None, NO_CUDA
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    return torch, dev, 0


def describe(torch, dev):
    """"torch 2.11.0 (CUDA 13.0) on NVIDIA H100 80GB HBM3": the peers' first "#" line."""
    return (f"torch {torch.__version__} (CUDA {torch.version.cuda}) on "
            f"{torch.cuda.get_device_name(dev)}")


class EventTimer:
    """Milliseconds of work on one stream, timed with two torch.cuda.Event records around it
    and an event synchronize after. With a stream, the work runs with that stream current
    and the events are recorded on it; without one, on the current stream."""

    def __init__(self, torch, stream=None):
        self.torch = torch
        self.stream = stream
        self.ev0 = torch.cuda.Event(enable_timing=True)
        self.ev1 = torch.cuda.Event(enable_timing=True)

    def ms(self, fn):
        """Milliseconds of fn()'s device work."""
        if self.stream is None:
            self.ev0.record()
            fn()
            self.ev1.record()
        else:
            with self.torch.cuda.stream(self.stream):
                self.ev0.record(self.stream)
                fn()
                self.ev1.record(self.stream)
        self.ev1.synchronize()
        return self.ev0.elapsed_time(self.ev1)

    def median_ms(self, fn, runs, warmup=0):
        """The median of runs timings of fn after warmup untimed calls (each synchronized)."""
        for _ in range(warmup):
            self.ms(fn)
        return statistics.median(self.ms(fn) for _ in range(runs))
