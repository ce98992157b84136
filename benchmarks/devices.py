"""Where a benchmark's models run (`--device`, `--attn-implementation`) and what measuring there takes.

CUDA runs asynchronously: a call returns once its kernels are queued, so a timed region waits for the device before
and after (`synchronize`). Peak memory is the caching allocator's high-water mark on CUDA; on CPU, where torch keeps
no allocator statistics (and tracemalloc sees only Python's own allocations), the process's resident high-water mark.
Only this module asks which device it is; the workloads call it the same way on every device.
"""

import re
import subprocess
from pathlib import Path

import torch

DEVICE_TYPES = ("cpu", "cuda")
ATTENTION_IMPLEMENTATIONS = ("eager", "sdpa", "flex_attention")


def parse_device(name: str) -> torch.device:
    """`--device`'s value as a torch device; ValueError, one line, for a device type the benchmarks do not measure or a
    CUDA device this torch cannot use."""
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"--device {name}: not a torch device (expected one of {', '.join(DEVICE_TYPES)})") from None
    if device.type not in DEVICE_TYPES:
        raise ValueError(f"--device {name}: the benchmarks measure {', '.join(DEVICE_TYPES)} only")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: this torch ({torch.__version__}) sees no CUDA device")
    return device


def synchronize(device) -> None:
    """Wait until every kernel queued on `device` has run (nothing to wait for on CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory(step, device) -> int:
    """Bytes that `step()` adds at its peak to what the process held before it: on CUDA the allocator's peak over its
    allocated bytes before; on CPU the resident size before to its high-water mark during the call, which Linux resets
    on request (/proc/self/clear_refs; run it where freed memory leaves the resident set: `run.MALLOC_ENV`)."""
    if torch.device(device).type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        step()
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    before = resident_bytes("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    step()
    return resident_bytes("VmHWM") - before


def resident_bytes(field_name: str) -> int:
    status = Path("/proc/self/status").read_text()
    return int(re.search(rf"{field_name}:\s+(\d+) kB", status).group(1)) * 1024


def device_name(device) -> str:
    """What the tables name the device by: the GPU's name on CUDA, the CPU's model otherwise."""
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model()


def cpu_model() -> str:
    """The CPU's model name, as `lscpu` gives it ("Model name"), or /proc/cpuinfo's where lscpu is missing."""
    try:
        listing = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        listing = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    found = re.search(r"^model name\s*:\s*(.+)$", listing, re.IGNORECASE | re.MULTILINE)
    return found.group(1).strip() if found else "unknown CPU"


def attention_implementation(model_class, requested: str) -> str:
    """`requested` where `model_class` supports it, else "eager" (the only one a reference without sdpa or
    flex_attention support has: transformers 4.37.2's Transformer-XL, transformers 5's XLNet). Each side's row
    records the implementation it ran."""
    supported = {"eager": True, "sdpa": getattr(model_class, "_supports_sdpa", False),
                 "flex_attention": getattr(model_class, "_supports_flex_attn", False)}  # fmt: skip
    return requested if supported[requested] else "eager"
