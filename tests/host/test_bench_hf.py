"""bench/bench_hf.py without a GPU: its --help, its argument checks, and its exit 77 (a
"skipped:" line saying why) where torch, transformers 5 or a GPU is missing (CUDA hidden
here, so that a machine with all of them skips too). Needs only python3.

    python3 tests/host/test_bench_hf.py SOURCE_DIR
"""
import os
import subprocess
import sys
import unittest

ROOT = sys.argv[1] if len(sys.argv) > 1 else "."
SCRIPT = os.path.join(ROOT, "bench", "bench_hf.py")
sys.path.insert(0, os.path.join(ROOT, "bench"))
import bench_hf  # noqa: E402  (imports nothing but the standard library at the top)


def run(*args, **env):
    e = dict(os.environ, **env)
    p = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                       env=e, timeout=300)
    return p.returncode, p.stdout, p.stderr


class BenchHf(unittest.TestCase):
    def test_help(self):
        rc, out, err = run("--help")
        self.assertEqual(rc, 0, err)
        for opt in ("--models", "--quick", "--out", "--impls", "--batches", "--prefill",
                    "--prefix", "--vocab", "--dry-run", "Exit status 77"):
            self.assertIn(opt, out)

    def test_bad_arguments(self):
        rc, _, err = run("--models", "mixtral,nope")
        self.assertEqual(rc, 2)
        self.assertIn("unknown model nope (have mixtral, qwen3_30b_a3b, olmoe, gpt_oss_20b, "
                      "deepseek_v3)", err)
        rc, _, err = run("--batches", "1,x")
        self.assertEqual(rc, 2)
        self.assertIn("--batches 1,x: comma-separated integers", err)
        rc, _, err = run("--prefill", "0")
        self.assertEqual(rc, 2)
        self.assertIn("must be positive", err)

    def test_no_gpu_skips_with_77(self):
        rc, out, err = run("--models", "olmoe", "--quick", CUDA_VISIBLE_DEVICES="",
                           HIP_VISIBLE_DEVICES="")
        self.assertEqual(rc, 77, out + err)
        self.assertRegex(out, r"bench_hf: skipped: (torch is not installed|transformers is not "
                              r"installed|transformers \S+; this benchmark needs transformers "
                              r"5|torch.cuda.is_available\(\) is False)")

    def test_parse_args(self):
        a = bench_hf.parse_args([])
        self.assertEqual(a.models, list(bench_hf.MODELS))
        self.assertEqual(a.batches, [1, 16, 64])
        self.assertEqual((a.prefill, a.prefix, a.vocab), (4096, 512, 32000))
        self.assertEqual((a.reps_prefill, a.reps_decode), (5, 50))
        a = bench_hf.parse_args(["--quick", "--models", "olmoe,mixtral", "--batches", "64,1,1",
                                 "--impls", "grouped_mm"])
        self.assertEqual(a.models, ["olmoe", "mixtral"])
        self.assertEqual(a.batches, [1, 64])
        self.assertEqual(a.impls, ["grouped_mm"])
        self.assertEqual((a.reps_prefill, a.reps_decode), (2, 20))
        a = bench_hf.parse_args(["--dry-run"])  # tiny: the CPU
        self.assertEqual((a.prefill, a.prefix, a.vocab, a.batches), (64, 16, 512, [1, 4]))

    def test_models_are_the_real_shapes(self):
        want = {"mixtral": ("hidden_size", 4096, 8, 2), "qwen3_30b_a3b": ("hidden_size", 2048,
                128, 8), "olmoe": ("hidden_size", 2048, 64, 8),
                "gpt_oss_20b": ("hidden_size", 2880, 32, 4),
                "deepseek_v3": ("hidden_size", 7168, 256, 8)}
        for name, (key, H, E, k) in want.items():
            _, opts, layers, _, _ = bench_hf.MODELS[name]
            experts = [opts[n] for n in ("num_local_experts", "num_experts", "n_routed_experts")
                       if n in opts]
            with self.subTest(model=name):
                self.assertEqual((opts[key], experts, opts["num_experts_per_tok"]),
                                 (H, [E], k))
                self.assertEqual(layers, 1 if name == "deepseek_v3" else 2)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
