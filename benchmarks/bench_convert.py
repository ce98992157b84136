"""Peak memory and time of `transformers-xl convert --from hf-legacy` on a full-size transfo-xl-wt103 folder.

Run from the repository root:

    python benchmarks/bench_convert.py [--workdir DIR] [--keep]

It writes a transformers 4.x folder with the transfo-xl-wt103 configuration (hub_configs/, 285M parameters) and random
weights (`pytorch_model.bin` holding every key, tied duplicates sharing storage, as 4.x saved it), converts it in a
child process, and prints the child's peak resident memory (ru_maxrss), the wall time and the peak as a multiple
of the checkpoint's size. Fails (exit status 1) if the peak reaches 3x the checkpoint. Timings on a shared machine are
noisy; the peak memory is not.
"""

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 3.0


def make_legacy_folder(folder: Path):
    """A 4.x-style folder with random weights: config.json + pytorch_model.bin (every key, tied pairs sharing one
    storage, as 4.x saved it)."""
    from transformers_xl import TransfoXLConfig, TransfoXLLMHeadModel

    config = TransfoXLConfig.from_pretrained(ROOT / "hub_configs" / "transfo-xl-wt103")
    with torch.device("meta"):
        model = TransfoXLLMHeadModel(config)
    model.to_empty(device="cpu")
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.02, generator=generator)
        model.transformer.pos_emb.inv_freq.copy_(1 / 10000 ** (torch.arange(0.0, config.d_model, 2.0) / config.d_model))
    model.tie_weights()
    folder.mkdir(parents=True)
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    (folder / "config.json").write_text(json.dumps(config.to_dict(), indent=2))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", help="where to write the folders (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the folders")
    args = parser.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench_convert."))
    source, output = workdir / "legacy-wt103", workdir / "converted-wt103"
    try:
        if not source.exists():
            start = time.perf_counter()
            make_legacy_folder(source)
            print(f"wrote the legacy folder in {time.perf_counter() - start:.0f} s")
        checkpoint = (source / "pytorch_model.bin").stat().st_size
        shutil.rmtree(output, ignore_errors=True)
        command = [sys.executable, "-m", "transformers_xl", "convert", str(source), str(output), "--from", "hf-legacy"]
        start = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        seconds = time.perf_counter() - start
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # (kB on Linux)
        written = sum(p.stat().st_size for p in output.glob("*.safetensors"))
        print(f"checkpoint {checkpoint / 2**30:.2f} GiB -> model.safetensors {written / 2**30:.2f} GiB")
        print(f"convert: {seconds:.0f} s wall, peak RSS {peak / 2**30:.2f} GiB = {peak / checkpoint:.2f}x the checkpoint")
        return 0 if peak < LIMIT * checkpoint else 1
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
