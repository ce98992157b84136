"""`benchmarks/run.py --quick`: the whole benchmark command at tiny sizes writes every row of its JSON and markdown
(with the legacy venv; without it, the workloads with a legacy side). Times are never asserted (the machine is
shared); only that each measurement was made and reported."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
LEGACY_ENV = "TRANSFORMERS_XL_LEGACY_PYTHON"

EXPECTED = {  # (section, model, workload) -> side names
    **{
        ("throughput", model, workload): sides
        for model, sides in (("Transformer-XL", ["ours", "transformers 4.37.2"]), ("XLNet", ["ours", "transformers 5"]))
        for workload in ("evaluation", "training forward + backward", "training step (AdamW)")
    },
    ("memory", "Transformer-XL", "training step, peak above the trained model"): ["ours", "transformers 4.37.2"],
    ("memory", "XLNet", "training step, peak above the trained model"): ["ours", "transformers 5"],
    **{
        ("bf16", model, workload): ["bf16", "fp32 eager"]
        for model in ("Transformer-XL", "XLNet")
        for workload in ("evaluation", "training forward + backward")
    },
    ("generation", "Transformer-XL", "prompt 8"): ["ours (cache)", "legacy 4.37.2", "ours (recompute)"],
    ("generation", "XLNet", "prompt 8"): ["ours", "transformers"],
    ("floor", "Transformer-XL", "greedy, prompt 8"): ["ours", "weight-streaming floor", "products alone"],
    ("floor", "XLNet", "greedy, prompt 8"): ["ours", "weight-streaming floor", "products alone"],
    **{
        ("contention", "Transformer-XL", kind): ["ours", "legacy 4.37.2"]
        for kind in ("quiet", "one core busy", "beside a torch process")
    },
    ("stream", "Transformer-XL", "attention length 8"): ["with memory", "sliding window", "evaluate (cache)"],
    ("stream", "Transformer-XL", "attention length 16"): ["with memory", "sliding window", "evaluate (cache)"],
    **{
        ("deploy", model, workload): sides
        for model in ("Transformer-XL", "XLNet")
        for workload, sides in (
            ("segment 1 x 16, memory 16", ["eager", "eager, cache", "onnxruntime", "compiled", "int8", "bf16 weights"]),
            ("greedy decoding, prompt 64, batch 1", ["eager", "int8", "bf16 weights"]),
            ("greedy decoding at a pretrained shape, prompt 64, batch 1", ["eager", "int8", "bf16 weights"]),
        )
    },
    **{
        ("decode split", model, workload): ["eager", "eager, products alone", "bf16 weights",
                                            "bf16 weights, products alone"]
        for model in ("Transformer-XL", "XLNet")
        for workload in ("greedy decoding, prompt 64, batch 1",
                         "greedy decoding at a pretrained shape, prompt 64, batch 1")  # fmt: skip
    },
}
LEGACY_SIDES = {"transformers 4.37.2", "legacy 4.37.2"}
NOT_IN_QUICK = {"compiled"}  # (the deploy workload's torch.compile side)
try:
    import onnxruntime  # noqa: F401
    import onnxscript  # noqa: F401
except ImportError:  # the deploy workload reports its ONNX Runtime side as failed (the onnx extra is missing)
    ONNX_SIDE_STATUS = "failed"
else:
    ONNX_SIDE_STATUS = "measured"


# The workloads with a legacy side, which the run without the legacy venv must report as not measured (the others
# run with it, in the run with the legacy venv).
LEGACY_WORKLOADS = ["peak", "throughput", "memory", "generation", "contention"]
# workload -> its sections, where they differ
SECTIONS = {"peak": [], "generation": ["generation", "floor"], "deploy": ["deploy", "decode split"]}


def run_quick(tmp_path, legacy_python, workloads=()):
    env = {key: value for key, value in os.environ.items() if key != LEGACY_ENV}
    if legacy_python:
        env[LEGACY_ENV] = legacy_python
    output = tmp_path / "results"
    chosen = ["--workloads", *workloads] if workloads else []
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", *chosen, "--output", str(output)],
        check=True,
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
    )
    return json.loads((output / "results.json").read_text()), (output / "results.md").read_text()


def check(results, table, legacy_measured, workloads=()):
    """The rows of `workloads` (all of them by default) and what they report."""
    sections = {section for w in workloads for section in SECTIONS.get(w, [w])} or {key[0] for key in EXPECTED}
    rows = {(row["section"], row["model"], row["workload"]): row for row in results["rows"]}
    assert set(rows) == {key for key in EXPECTED if key[0] in sections}
    assert set(results["matmul_peak_flops"]) == {"float32", "bfloat16"}
    assert all(flops > 0 for flops in results["matmul_peak_flops"].values())
    measured = results["matmul_peak_measurements"]
    expected = {(when, dtype) for when in ("start", "end") for dtype in ("float32", "bfloat16")}
    assert {(m["when"], m["dtype"]) for m in measured} == expected
    for dtype, flops in results["matmul_peak_flops"].items():  # the higher of the two measurements is the peak
        assert flops == max(m["flops"] for m in measured if m["dtype"] == dtype)
    for key, row in rows.items():
        assert list(row["sides"]) == EXPECTED[key], key
        for name, side in row["sides"].items():
            expected = "not measured" if name in LEGACY_SIDES and not legacy_measured else "measured"
            if name in NOT_IN_QUICK or name == "onnxruntime":
                expected = "not measured" if name in NOT_IN_QUICK else ONNX_SIDE_STATUS
            assert side["status"] == expected, (key, name, side)
            if expected == "measured":
                assert side["min"] <= side["median"] and len(side["values"]) >= 1
        both = all(side["status"] == "measured" for side in list(row["sides"].values())[:2])
        zero = row["unit"] == "bytes" and list(row["sides"].values())[1].get("median") == 0  # (tiny sizes)
        assert (row["ratio"] is not None) == (both and not zero), key
        assert f"| {row['config']} | {row['model']} | {row['workload']} |" in table, key
    # Same weights and inputs on both sides: the references' logits are ours.
    for model in ("Transformer-XL", "XLNet"):
        diff = rows[("throughput", model, "evaluation")]["max_abs_logit_diff"]
        if model == "XLNet" or legacy_measured:
            assert diff < 1e-4
        else:
            assert diff is None
        assert rows[("throughput", model, "evaluation")]["ideal_flops"] > 0
    assert rows[("generation", "XLNet", "prompt 8")]["identical_tokens"] is True
    assert rows[("generation", "Transformer-XL", "prompt 8")]["identical_tokens"] is (True if legacy_measured else None)
    for model in ("Transformer-XL", "XLNet") if "deploy" in sections else ():  # (each side against eager)
        differences = rows[("deploy", model, "segment 1 x 16, memory 16")]["max_abs_logit_diff"]
        onnx = {"onnxruntime"} if ONNX_SIDE_STATUS == "measured" else set()
        assert differences.keys() == {"eager, cache", "int8", "bf16 weights"} | onnx
        assert differences.get("onnxruntime", 0) < 1e-4 and differences["int8"] < 0.1
        assert differences["eager, cache"] < 1e-4  # (its first call: the session's memory, as eager's)
        pretrained = rows[("deploy", model, "greedy decoding at a pretrained shape, prompt 64, batch 1")]
        assert pretrained["max_abs_logit_diff"].keys() == {"int8", "bf16 weights"}  # (decoding alone, its variants)
        assert pretrained["max_abs_logit_diff"]["int8"] < 0.1
        for key in (key for key in EXPECTED if key[:2] == ("decode split", model)):  # (steps less their products)
            row = rows[key]
            medians = {name: side["median"] for name, side in row["sides"].items()}
            rest = medians["bf16 weights"] - medians["bf16 weights, products alone"]
            line = [line for line in table.splitlines() if line.startswith(f"| {row['config']} | {model} | {key[2]} |")
                    and line.count("|") == 9]  # fmt: skip
            assert len(line) == 1 and f" / {rest * 1e3:.2f} | " in line[0], line
    titles = {"throughput": "Throughput (fp32)", "memory": "Peak memory", "bf16": "bf16 autocast",
              "generation": "Generation", "stream": "evaluation of a stream", "deploy": "Deployment",
              "floor": "weight-streaming floor", "contention": "beside other work",
              "decode split": "Where a decoding step's time goes"}  # fmt: skip
    for section, title in titles.items():
        assert (title in table) == (section in sections), title
    assert results["cpu"] and results["cpu"] in table.splitlines()[0]
    assert results["gemv_bytes_per_second"] == max(m["bytes_per_second"] for m in results["gemv_measurements"]) > 0
    for model in ("Transformer-XL", "XLNet"):  # the floor: the weights a step reads at the measured bandwidth
        row = rows[("floor", model, "greedy, prompt 8")]
        bandwidths = {m["bytes_per_second"] for m in results["gemv_measurements"]}  # (the best known when it ran)
        assert row["weight_bytes"] > 0 and row["gemv_bytes_per_second"] in bandwidths
        floor = row["sides"]["weight-streaming floor"]["median"]
        assert floor == pytest.approx(row["weight_bytes"] / row["gemv_bytes_per_second"])
        products_over_floor = row["sides"]["products alone"]["median"] / floor
        line = next(line for line in table.splitlines() if line.startswith(f"| {row['config']} | {model} | greedy, "))
        assert line.endswith(f" | {products_over_floor:.2f}x |") and line.count("|") == 10
    for kind in ("quiet", "one core busy", "beside a torch process"):  # each side against its own quiet time
        row = rows[("contention", "Transformer-XL", kind)]
        assert set(row["slowdown"]) == ({"ours", "legacy 4.37.2"} if legacy_measured else {"ours"})
    assert rows[("contention", "Transformer-XL", "quiet")]["slowdown"]["ours"] == 1.0
    assert "torch.compile" not in table  # --quick leaves compilation out (minutes on CPU)


def test_quick_run_without_the_legacy_venv(tmp_path):
    results, table = run_quick(tmp_path, None, LEGACY_WORKLOADS)
    assert results["legacy_python"] is None
    check(results, table, legacy_measured=False, workloads=LEGACY_WORKLOADS)
    assert "not measured (transformers 4.37.2)" in table


@pytest.mark.skipif(not os.environ.get(LEGACY_ENV), reason=f"${LEGACY_ENV} (the transformers 4.37.2 venv) is not set")
def test_quick_run_with_the_legacy_venv(tmp_path):
    results, table = run_quick(tmp_path, os.environ[LEGACY_ENV])
    check(results, table, legacy_measured=True)
    assert not [line for line in table.splitlines() if "not measured" in line and "4.37.2" in line]


def test_keep_freed_memory_reaches_every_timed_worker_but_not_the_memory_measurement(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import argparse

    import run

    started = []
    monkeypatch.setattr(run, "Worker", lambda *args, env=None: started.append(env))
    for keep in (False, True):
        bench = run.Run(argparse.Namespace(threads=2, keep_freed_memory=keep), tmp_path)
        bench.worker(tmp_path, "ours")
        bench.worker(tmp_path, "legacy", "python", env=run.MALLOC_ENV)
    assert started == [None, run.MALLOC_ENV, run.KEEP_FREED_MEMORY_ENV, run.MALLOC_ENV]
    assert run.KEEP_FREED_MEMORY_ENV["MALLOC_MMAP_MAX_"] == "0"


def test_streamed_weight_bytes_counts_each_weight_a_decoding_step_reads_once(monkeypatch):
    """Tied weights once; not the relative position projections (the cache keeps their products), nor input
    embedding tables that the output layer does not share (a step reads one row of each); the embedding's
    projections, which a step multiplies by, are read."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import bench_generation

    from transformers_xl import TransfoXLConfig, TransfoXLLMHeadModel, XLNetConfig, XLNetLMHeadModel

    def size(parameters):
        return sum(p.numel() * p.element_size() for p in parameters)

    xlnet = XLNetLMHeadModel(XLNetConfig(vocab_size=50, d_model=16, n_layer=2, n_head=2, d_inner=32))
    assert xlnet.lm_loss.weight is xlnet.transformer.word_embedding.weight
    positions = [layer.rel_attn.r for layer in xlnet.transformer.layer]
    assert bench_generation.streamed_weight_bytes(xlnet) == size(xlnet.parameters()) - size(positions)
    for tie in (True, False):
        txl = TransfoXLLMHeadModel(TransfoXLConfig(vocab_size=50, cutoffs=[10, 30], d_model=16, d_embed=16, n_head=2,
                                                   d_head=8, d_inner=32, n_layer=2, tie_weight=tie))
        skipped = [layer.dec_attn.r_net.weight for layer in txl.transformer.layers]
        if not tie:
            skipped += [layer.weight for layer in txl.transformer.word_emb.emb_layers]
        assert bench_generation.streamed_weight_bytes(txl) == size(txl.parameters()) - size(skipped), tie


@pytest.mark.parametrize("model_type", ["transfo-xl", "xlnet"])
def test_step_products_are_the_products_of_one_decoding_step(model_type, monkeypatch):
    """The floor's "products alone" side runs what one decoding step multiplies: its few rows (Transformer-XL's new
    token) by each projection, feed-forward and output weight, each once (the output layer in its clusters' row
    ranges)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import bench_generation

    from transformers_xl import TransfoXLConfig, TransfoXLLMHeadModel, XLNetConfig, XLNetLMHeadModel

    torch.manual_seed(0)
    if model_type == "transfo-xl":
        model = TransfoXLLMHeadModel(TransfoXLConfig(vocab_size=50, cutoffs=[10, 30], div_val=1, d_model=16, d_embed=16,
                                                     n_head=2, d_head=8, d_inner=32, n_layer=2, mem_len=32,
                                                     eos_token_id=None))  # fmt: skip
        weights = [(layer.dec_attn.qkv_net.weight, layer.dec_attn.o_net.weight, layer.pos_ff.CoreNet[0].weight,
                    layer.pos_ff.CoreNet[3].weight) for layer in model.transformer.layers]  # fmt: skip
        weights, kwargs = [*sum(weights, ()), model.crit.out_layers[0].weight, model.crit.cluster_weight], {}
    else:
        model = XLNetLMHeadModel(XLNetConfig(vocab_size=50, d_model=16, n_layer=2, n_head=2, d_inner=32))
        weights = [(*(getattr(layer.rel_attn, name) for name in "qkvo"), layer.ff.layer_1.weight,
                    layer.ff.layer_2.weight) for layer in model.transformer.layer]  # fmt: skip
        weights, kwargs = [*sum(weights, ()), model.lm_loss.weight], {"use_mems": True}
    calls = bench_generation.step_products(model.eval(), bench_generation.random_prompt(8, 50), **kwargs)
    if model_type == "transfo-xl":  # (XLNet's step has 1-3 rows: the new token, the dummy one, the query stream)
        assert {x.shape[:-1].numel() for x, _, _ in calls} == {1}

    def storage(tensor):
        return tensor.untyped_storage().data_ptr()

    assert {storage(weight) for _, weight, _ in calls} == {storage(weight) for weight in weights}
    assert sum(weight.numel() for _, weight, _ in calls) == sum(weight.numel() for weight in weights)
    assert bench_generation.products_alone(calls, passes=3)() > 0


def test_alternate_reverses_the_order_every_other_round():
    """No side always runs right after the same other one; the values come back per side, in the given order."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from timing import alternate
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    calls = []
    runs = {name: (lambda name=name: calls.append(name) or len(calls)) for name in "ABC"}
    values = alternate(runs, rounds=3, warmup=1)
    assert calls == list("ABC" "ABC" "CBA" "ABC")
    assert list(values) == list("ABC") and values["A"] == [4, 9, 10] and values["C"] == [6, 7, 12]


def test_deploy_decoding_runs_on_torch_threads_whatever_the_other_processes_did(monkeypatch):
    """The deploy workload's decoding sides take turns in workers: inside `on_torch_threads` a decoding step keeps
    torch's thread count even where `IdleCores` saw the other workers' calls as load, and the policy comes back after
    the block, also after an error."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import run

    from transformers_xl.modeling import decoding_threads

    monkeypatch.setattr(decoding_threads, "idle_cores", lambda: 1)  # (the other workers' calls counted as load)
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with decoding_threads.on_a_decoding_step_threads():
            assert torch.get_num_threads() == 1
        with pytest.raises(RuntimeError), run.on_torch_threads():
            with decoding_threads.on_a_decoding_step_threads():
                assert torch.get_num_threads() == 2
            raise RuntimeError("a failed call")
        assert decoding_threads.DECODING_THREADS == "idle cores"
    finally:
        torch.set_num_threads(previous)
