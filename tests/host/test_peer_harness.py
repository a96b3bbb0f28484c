"""bench/peers/_harness.py, the torch peers' one timing harness, on a stand-in torch
module (no torch or GPU needed), and the four peers use it rather than their own.

    python3 tests/host/test_peer_harness.py SOURCE_DIR
"""
import os
import sys
import types
import unittest

PEERS = os.path.join(sys.argv[1] if len(sys.argv) > 1 else ".", "bench", "peers")
sys.path.insert(0, PEERS)
import _harness  # noqa: E402


class FakeTorch(types.ModuleType):
    """What the harness touches of torch, logging every call into self.log."""

    def __init__(self, available=True):
        super().__init__("torch")
        self.log = []
        self.__version__ = "9.9.0"
        self.version = types.SimpleNamespace(cuda="13.0")
        torch = self
        times = iter([1.0, 5.0, 3.0, 2.0, 4.0, 7.0, 6.0, 8.0, 9.0, 10.0])

        class Event:
            def __init__(self, enable_timing=False):
                assert enable_timing
                self.name = "ev%d" % Event.made
                Event.made += 1

            def record(self, stream=None):
                torch.log.append(("record", self.name, stream))

            def synchronize(self):
                torch.log.append(("synchronize", self.name))

            def elapsed_time(self, other):
                torch.log.append(("elapsed", self.name, other.name))
                return next(times)

        Event.made = 0

        class StreamContext:
            def __init__(self, s):
                self.s = s

            def __enter__(self):
                torch.log.append(("enter", self.s))

            def __exit__(self, *exc):
                torch.log.append(("exit", self.s))

        self.cuda = types.SimpleNamespace(
            is_available=lambda: available,
            set_device=lambda d: torch.log.append(("set_device", d)),
            get_device_name=lambda d: "Fake GPU",
            Event=Event,
            stream=StreamContext)
        self.device = lambda kind, index: (kind, index)


class HarnessTest(unittest.TestCase):
    def with_torch(self, fake):
        saved = sys.modules.get("torch")
        sys.modules["torch"] = fake
        self.addCleanup(lambda: sys.modules.pop("torch") if saved is None
                        else sys.modules.__setitem__("torch", saved))

    def test_no_torch(self):
        saved = sys.modules.get("torch")
        sys.modules["torch"] = None  # import torch raises ImportError
        try:
            self.assertEqual(_harness.open_device(), (None, None, _harness.NO_TORCH))
        finally:
            if saved is None:
                del sys.modules["torch"]
            else:
                sys.modules["torch"] = saved
        self.assertEqual(_harness.NO_TORCH, 2)

    def test_no_cuda(self):
        self.with_torch(FakeTorch(available=False))
        self.assertEqual(_harness.open_device(), (None, None, _harness.NO_CUDA))
        self.assertEqual(_harness.NO_CUDA, 3)

    def test_device_and_description(self):
        fake = FakeTorch()
        self.with_torch(fake)
        torch, dev, status = _harness.open_device()
        self.assertIs(torch, fake)
        self.assertEqual((dev, status), (("cuda", 0), 0))
        self.assertEqual(fake.log, [("set_device", ("cuda", 0))])
        self.assertEqual(_harness.describe(torch, dev), "torch 9.9.0 (CUDA 13.0) on Fake GPU")

    def test_timer_on_a_stream(self):
        fake = FakeTorch()
        t = _harness.EventTimer(fake, "S")
        ms = t.ms(lambda: fake.log.append(("work",)))
        self.assertEqual(ms, 1.0)
        self.assertEqual(fake.log, [("enter", "S"), ("record", "ev0", "S"), ("work",),
                                    ("record", "ev1", "S"), ("exit", "S"),
                                    ("synchronize", "ev1"), ("elapsed", "ev0", "ev1")])

    def test_timer_on_the_current_stream(self):
        fake = FakeTorch()
        t = _harness.EventTimer(fake)
        t.ms(lambda: fake.log.append(("work",)))
        self.assertEqual(fake.log, [("record", "ev0", None), ("work",),
                                    ("record", "ev1", None), ("synchronize", "ev1"),
                                    ("elapsed", "ev0", "ev1")])

    def test_median_after_warmup(self):
        fake = FakeTorch()
        calls = []
        t = _harness.EventTimer(fake)
        # warm-up takes 1.0 and 5.0; the runs 3, 2, 4, 7, 6: median 4
        self.assertEqual(t.median_ms(lambda: calls.append(1), runs=5, warmup=2), 4.0)
        self.assertEqual(len(calls), 7)

    def test_the_four_peers_use_it(self):
        for name in ("torch_add.py", "torch_copy.py", "torch_ops.py", "torch_moe.py"):
            with open(os.path.join(PEERS, name)) as f:
                text = f.read()
            with self.subTest(peer=name):
                self.assertIn("import _harness", text)
                self.assertIn("_harness.open_device()", text)
                self.assertNotIn("torch.cuda.is_available", text)
                self.assertNotIn("torch.cuda.Event(enable_timing", text)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
