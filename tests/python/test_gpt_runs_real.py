"""cuda/tools/gpt_runs.py over the real examples/python/gpt.py: a tiny model trained on the CPU
twice, interleaved and not, so that the tool's reading of gpt.py's summary lines is checked
against what gpt.py prints (tests/test_gpt_runs.py checks the tool itself with a stand-in).
Needs PyTorch with scaled_dot_product_attention (2.0 or later), which gpt.py compares against."""
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
    pytest.skip("gpt.py compares against torch's scaled_dot_product_attention (PyTorch >= 2.0)",
                allow_module_level=True)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TOOL = os.path.join(ROOT, "cuda", "tools", "gpt_runs.py")
TINY = ["--device", "cpu", "--layers", "1", "--embd", "32", "--heads", "2", "--block", "24",
        "--batch", "3", "--steps", "12", "--every", "100", "--threads", "1"]


@pytest.mark.parametrize("extra", [[], ["--interleave", "3", "--warmup", "3"]])
def test_gpt_runs_reads_each_run_of_the_real_script(extra):
    out = subprocess.run([sys.executable, TOOL, "--runs", "2", "one=", "two=OMP_NUM_THREADS=1",
                          "--"] + TINY + extra, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    runs = [l for l in out.stdout.splitlines() if l.startswith("run ")]
    assert [l.split(":")[0].split()[-1] for l in runs] == ["one", "two", "one", "two"], out.stdout
    for label in ("one", "two"):
        row = next(l for l in out.stdout.splitlines() if l.startswith(f"| {label} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        ratios = [float(x) for x in cells[1].split(",")]
        assert len(ratios) == 2 and all(0 < r < 100 for r in ratios), row
        # The interleaved runs print their rounds' median; the others have none.
        assert (cells[3] != "-") == bool(extra), row
        assert cells[7] == "2 of 2", row  # gpt.py's own loss check passed in both runs
