"""Same machine, thread count and inputs: bit-identical losses, gradients, logits and generate() scores in every
process, fp32 and bf16, with and without `torch.use_deterministic_algorithms(True)` (nothing chosen by timing or
by the machine's load)."""

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent / "determinism_transfo_xl.py"


def test_three_processes_give_the_same_bits():
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    digests = [
        subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=environment,
                       check=True).stdout.strip()
        for _ in range(3)
    ]  # fmt: skip
    assert len(set(digests)) == 1 and len(digests[0]) == 2 * 64 + 1, digests
