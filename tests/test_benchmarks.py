"""`benchmarks/run.py --quick`: the whole benchmark command at tiny sizes writes every row of its JSON and markdown
(with the legacy venv; without it, the workloads with a legacy side). Times are never asserted (the machine is
shared); only that each measurement was made and reported."""

import importlib.util
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
    ("floor", "Transformer-XL", "greedy, prompt 8"): ["ours", "weight-streaming floor"],
    ("floor", "XLNet", "greedy, prompt 8"): ["ours", "weight-streaming floor"],
    ("static", "Transformer-XL", "float32, prompt 8"): ["static", "eager"],
    ("static", "XLNet", "float32, prompt 8"): ["static", "eager"],
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
# int8 (quantize_dynamic_int8) is torchao's: without it the deploy workload leaves its int8 side out
INT8_SIDE_STATUS = "measured" if importlib.util.find_spec("torchao") else "not measured"


# The workloads with a legacy side, run with the legacy venv (and reported as not measured without it), and the
# others, run once, without it: each workload of --quick (all but compile) in one of the two runs, and both measure
# the matmul peak ("peak") that the tables quote.
LEGACY_WORKLOADS = ["peak", "throughput", "memory", "generation"]
OTHER_WORKLOADS = ["peak", "bf16", "static", "stream", "deploy"]
# workload -> its sections, where they differ
SECTIONS = {"peak": [], "generation": ["generation", "floor"]}


def run_quick(tmp_path, legacy_python, workloads=()):
    """The command's results and tables, on one thread (as the test processes, tests/conftest.py: beside the other
    test process on 2 cores, the default 2 threads made these runs 1.6x slower)."""
    env = {key: value for key, value in os.environ.items() if key != LEGACY_ENV}
    if legacy_python:
        env[LEGACY_ENV] = legacy_python
    output = tmp_path / "results"
    chosen = ["--workloads", *workloads] if workloads else []
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--device", "cpu", "--threads", "1", *chosen,
         "--output", str(output)],  # fmt: skip
        check=True,
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
    )
    results = json.loads((output / "results.json").read_text())
    assert results["threads"] == 1
    return results, (output / "results.md").read_text()


def check(results, table, legacy_measured, workloads=()):
    """The rows of `workloads` (all of them by default) and what they report."""
    sections = {section for w in workloads for section in SECTIONS.get(w, [w])} or {key[0] for key in EXPECTED}
    rows = {(row["section"], row["model"], row["workload"]): row for row in results["rows"]}
    assert set(rows) == {key for key in EXPECTED if key[0] in sections}
    assert results["device"] == "cpu" and results["attn_implementation"] == "sdpa"
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
            expected = {"compiled": "not measured", "onnxruntime": ONNX_SIDE_STATUS, "int8": INT8_SIDE_STATUS}.get(
                name, expected
            )
            assert side["status"] == expected, (key, name, side)
            if expected == "measured":
                assert side["min"] <= side["median"] and len(side["values"]) >= 1
        both = all(side["status"] == "measured" for side in list(row["sides"].values())[:2])
        zero = row["unit"] == "bytes" and list(row["sides"].values())[1].get("median") == 0  # (tiny sizes)
        assert (row["ratio"] is not None) == (both and not zero), key
        assert f"| {row['config']} | {row['model']} | {row['workload']} |" in table, key
    supported = supported_attention()
    for key, row in rows.items():  # each side's attention: the requested sdpa where its model supports it
        if key[0] in ("throughput", "memory"):
            assert row["attn_implementation"]["ours"] == supported[key[1]], key
            if len(row["attn_implementation"]) > 1:  # (the reference, where it ran)
                reference = list(row["sides"])[1]
                assert row["attn_implementation"][reference] == "eager", key  # (neither reference has sdpa)
    # Same weights and inputs on both sides: the references' logits are ours.
    for model in ("Transformer-XL", "XLNet") if "throughput" in sections else ():
        diff = rows[("throughput", model, "evaluation")]["max_abs_logit_diff"]
        if model == "XLNet" or legacy_measured:
            assert diff < 1e-4
        else:
            assert diff is None
        assert rows[("throughput", model, "evaluation")]["ideal_flops"] > 0
    if "generation" in sections:
        assert rows[("generation", "XLNet", "prompt 8")]["identical_tokens"] is True
        identical = rows[("generation", "Transformer-XL", "prompt 8")]["identical_tokens"]
        assert identical is (True if legacy_measured else None)
    for model in ("Transformer-XL", "XLNet") if "deploy" in sections else ():  # (each side against eager)
        differences = rows[("deploy", model, "segment 1 x 16, memory 16")]["max_abs_logit_diff"]
        onnx = {"onnxruntime"} if ONNX_SIDE_STATUS == "measured" else set()
        int8 = {"int8"} if INT8_SIDE_STATUS == "measured" else set()
        assert differences.keys() == {"eager, cache", "bf16 weights"} | onnx | int8
        assert differences.get("onnxruntime", 0) < 1e-4 and differences.get("int8", 0) < 0.1
        assert differences["eager, cache"] < 1e-4  # (its first call: the session's memory, as eager's)
        pretrained = rows[("deploy", model, "greedy decoding at a pretrained shape, prompt 64, batch 1")]
        assert pretrained["max_abs_logit_diff"].keys() == {"bf16 weights"} | int8  # (decoding alone, its variants)
    titles = {"throughput": "Throughput (fp32)", "memory": "Peak memory", "bf16": "bf16 autocast",
              "generation": "Generation, greedy", "stream": "evaluation of a stream", "deploy": "Deployment",
              "floor": "Generation against the weight-streaming floor", "static": "with the static cache"}  # fmt: skip
    for section, title in titles.items():
        assert (title in table) == (section in sections), title
    assert results["cpu"] and results["cpu"] in table.splitlines()[0]
    assert results["gemv_bytes_per_second"] == max(m["bytes_per_second"] for m in results["gemv_measurements"]) > 0
    for model in ("Transformer-XL", "XLNet") if "floor" in sections else ():  # the weights a step reads, at the bandwidth
        row = rows[("floor", model, "greedy, prompt 8")]
        bandwidths = {m["bytes_per_second"] for m in results["gemv_measurements"]}  # (the best known when it ran)
        assert row["weight_bytes"] > 0 and row["gemv_bytes_per_second"] in bandwidths
        floor = row["sides"]["weight-streaming floor"]["median"]
        assert floor == pytest.approx(row["weight_bytes"] / row["gemv_bytes_per_second"])
        # ours: the generation workload's own measurement at that prompt
        assert row["sides"]["ours"]["values"] == rows[("generation", model, "prompt 8")]["sides"][
            "ours (cache)" if model == "Transformer-XL" else "ours"]["values"]  # fmt: skip
    if "static" in sections:  # (--quick: the static cache's steps not compiled)
        for model in ("Transformer-XL", "XLNet"):
            row = rows[("static", model, "float32, prompt 8")]
            assert row["identical_tokens"] is True and row["compiled"] is False and row["floor_seconds"] > 0
            assert row["first_call_seconds"] > 0 and "s (not compiled) |" in table
    assert "torch.compile" not in table  # --quick leaves compilation out (minutes on CPU)


def supported_attention():
    """model -> the attention implementation ours runs when sdpa is asked for (sdpa, once the model supports it)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from devices import attention_implementation
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    import transformers_xl

    classes = {"Transformer-XL": transformers_xl.TransfoXLLMHeadModel, "XLNet": transformers_xl.XLNetLMHeadModel}
    return {model: attention_implementation(model_class, "sdpa") for model, model_class in classes.items()}


def test_quick_run_without_the_legacy_venv(tmp_path):
    """The workloads without a legacy side, and the legacy ones reported as not measured: all four where the legacy
    venv is missing (the run with it is skipped), else one of them."""
    legacy_workloads = ["memory"] if os.environ.get(LEGACY_ENV) else LEGACY_WORKLOADS[1:]
    workloads = OTHER_WORKLOADS + legacy_workloads
    results, table = run_quick(tmp_path, None, workloads)
    assert results["legacy_python"] is None
    check(results, table, legacy_measured=False, workloads=workloads)
    assert "not measured (transformers 4.37.2)" in table


@pytest.mark.skipif(not os.environ.get(LEGACY_ENV), reason=f"${LEGACY_ENV} (the transformers 4.37.2 venv) is not set")
def test_quick_run_with_the_legacy_venv(tmp_path):
    results, table = run_quick(tmp_path, os.environ[LEGACY_ENV], LEGACY_WORKLOADS)
    check(results, table, legacy_measured=True, workloads=LEGACY_WORKLOADS)
    assert not [line for line in table.splitlines() if "not measured" in line and "4.37.2" in line]


def test_gpu_session_script_runs_the_recipes_end_to_end_on_cpu_at_tiny_size(tmp_path):
    """benchmarks/gpu_session.sh, the GPU session's one command, through its device switch on CPU with --quick: the
    recipes' tiny stand-ins (one per model and task), every side under bf16 autocast (transformers 4.37.2's too,
    with the legacy venv: its adaptive embedding fails under autocast unless run without it), throughput and memory
    rows (the memory in the throughput's workers), NVIDIA's A100 column on the recipe that has a figure, and the log."""
    legacy = bool(os.environ.get(LEGACY_ENV))
    env = dict(os.environ, PYTHON=sys.executable, OUT=str(tmp_path / "out"), WHEELS=str(tmp_path / "no-wheels"))
    subprocess.run([str(ROOT / "benchmarks" / "gpu_session.sh"), "--quick", "--device", "cpu", "--threads", "1"],
                   check=True, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL)  # fmt: skip
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    table = (tmp_path / "out" / "results.md").read_text()
    assert results["configs"] == ["recipes"] and results["autocast"] == "bf16" and results["finished"] is True
    assert "every side's evaluation and training under bf16 autocast" in table.splitlines()[0]
    assert "**Throughput (bf16 autocast)" in table and "**Peak memory of a training step (bf16 autocast" in table
    rows = {(row["section"], row["config"], row["workload"]): row for row in results["rows"]}
    cases = {"wt103 large": "transformers 4.37.2", "xlnet-base classification": "transformers 5",
             "xlnet-base permutation LM": "transformers 5"}  # fmt: skip
    workloads = {"throughput": ["evaluation (loss)", "training forward + backward", "training step (AdamW)"],
                 "memory": ["training step, peak above the trained model"]}  # fmt: skip
    assert set(rows) == {(section, case, w) for case in cases for section, names in workloads.items() for w in names}
    for (section, case, workload), row in rows.items():
        assert list(row["sides"]) == ["ours", cases[case]]
        assert row["sides"]["ours"]["status"] == "measured", (case, workload)
        reference = "not measured" if cases[case] == "transformers 4.37.2" and not legacy else "measured"
        assert row["sides"][cases[case]]["status"] == reference, (case, workload, row["sides"])
    for case in cases:  # (bf16 logits: the sides agree to bf16's precision)
        diff = rows[("throughput", case, "evaluation (loss)")]["max_abs_logit_diff"]
        assert diff is None if case == "wt103 large" and not legacy else diff < 0.5, case
    step = rows[("throughput", "wt103 large", "training step (AdamW)")]
    assert step["nvidia_a100_tokens_per_second"] == 25_084
    assert "| ours / NVIDIA 1 x A100 (published" in table and "x of 25,084 |" in table
    assert "max |logit diff| ours vs transformers 5" in (tmp_path / "out" / "log.txt").read_text()


def test_recipe_cases_have_the_papers_sizes():
    """The sizes issue 47 asks for, read from training.recipes and hub_configs (one source of truth), and their tiny
    stand-ins keep each one's structure."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import run
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    cases = {case.name: case for case in run.recipe_cases()}

    def size(case, *keys):
        return tuple(case.config.get(key) for key in keys) + (case.length, case.memory_length)

    transfo_xl = ("n_layer", "d_model", "n_head", "d_inner", "div_val", "vocab_size", "cutoffs")
    assert size(cases["wt103 base"], *transfo_xl) == (16, 512, 8, 2048, 1, 267735, [20000, 40000, 200000], 192, 192)
    assert size(cases["wt103 large"], *transfo_xl) == (18, 1024, 16, 4096, 4, 267735, [20000, 40000, 200000], 384, 384)
    assert size(cases["enwik8 12 layers"], *transfo_xl[:4], "vocab_size", "cutoffs") == (12, 512, 8, 2048, 204, [], 512,
                                                                                           512)  # fmt: skip
    xlnet = ("n_layer", "d_model", "n_head", "d_inner", "vocab_size")
    for name, shape in (("xlnet-base", (12, 768, 12, 3072, 32000)), ("xlnet-large", (24, 1024, 16, 4096, 32000))):
        for task, label in (("classification", "classification"), ("plm", "permutation LM")):
            case = cases[f"{name} {label}"]
            assert (case.model, case.task, size(case, *xlnet)) == ("xlnet", task, (*shape, 512, 0))
        assert cases[f"{name} permutation LM"].num_predict == 85
    assert all(case.config["dropout"] == 0 and case.config.get("dropatt", 0) == 0 for case in cases.values())
    assert {name: case.nvidia_a100 for name, case in cases.items() if case.nvidia_a100} == {
        "wt103 base": 59_961, "wt103 large": 25_084}  # fmt: skip
    assert (cases["wt103 base"].cuda_batch, cases["wt103 large"].cuda_batch) == (32, 16)
    # the words by Zipf's law, as the adaptive softmax meets them in the corpus: most targets in its head cluster
    tokens = run.random_tokens(cases["wt103 base"], torch.Generator().manual_seed(0))
    assert tokens.shape == (2, 4, 192) and 0.7 < (tokens < 20000).float().mean() < 0.9
    uniform = run.random_tokens(cases["enwik8 12 layers"], torch.Generator().manual_seed(0))
    assert not cases["enwik8 12 layers"].zipf and uniform.shape == (2, 8, 512) and uniform.max() < 204
    tiny = {case.name: case for case in run.chosen_cases(["recipes"], quick=True)}
    assert list(tiny) == list(run.QUICK_RECIPES)
    large = tiny["wt103 large"]
    assert (large.config["div_val"], len(large.config["cutoffs"]), large.config["vocab_size"]) == (4, 3, 1000)
    assert large.config["d_embed"] // 4**3 >= 1 and large.batch * large.length <= 32  # (every cluster keeps a width)
    assert tiny["xlnet-base permutation LM"].task == "plm" and tiny["xlnet-base permutation LM"].num_predict == 4
    assert run.chosen_cases(["issue"], quick=True) == run.QUICK_CASES  # (--quick's default: unchanged)
    assert [case.name for case in run.chosen_cases(["issue", "recipes"], quick=False)] == ["issue", "issue", *cases]


def test_ideal_flops_bound_the_gemm_flops_ours_spends_from_below(monkeypatch, tmp_path):
    """`ideal_forward_flops` (the % of peak column) counts the work an evaluation needs, for each task, of the full
    output and of the loss (the recipes' evaluation: the adaptive softmax's tail clusters score their targets only):
    ours' GEMM FLOPs (FlopCounterMode) are at least that and within 2x of it at the tiny recipes' shapes (the
    permutation LM's last layer computes only the query stream, which the output reads)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from dataclasses import replace

    import run
    from torch.utils.flop_counter import FlopCounterMode

    for index, case in enumerate(run.tiny(case) for case in run.recipe_cases() if "base" in case.name):
        case = replace(case, length=64, config=dict(case.config, mem_len=64 if case.memory_length else None))
        run.write_case_folder(case, tmp_path / str(index))
        session = run.Session(tmp_path / str(index), "ours")
        for labels in (None, session.labels):
            with FlopCounterMode(display=False) as counter:
                session.model(session.input_ids, mems=session.mems or None, labels=labels, **session.extra)
            ideal = run.ideal_forward_flops(case, labels)
            assert 1 <= counter.get_total_flops() / ideal < 2, (case.name, labels is None)
        if case.model == "transfo-xl":  # (the loss: the tail clusters score their targets' positions only)
            assert case.evaluate_loss and ideal < run.ideal_forward_flops(case)


def test_a_failing_side_fails_its_case_rows_and_the_run_goes_on(monkeypatch, tmp_path):
    """A side whose worker fails (a GPU out of memory, say) fails its case's remaining throughput rows and its memory
    row with the error's first line, the other side's are not measured, and the partial results say the run has
    not finished. Workers get --autocast. (Recording workers that answer at once: no processes.)"""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import argparse

    import run

    class Failing:
        def __init__(self, python, script, *args, env=None):
            self.implementation, self.autocast = args[2], args[-1]
            started.append(self)

        def ask(self, request):
            if self.implementation == "transformers" and request["op"] in ("time", "peak_memory"):
                raise run.WorkerError("OutOfMemoryError: CUDA out of memory.\nTried to allocate 2.00 GiB")
            if request["op"] == "logits":
                torch.save(torch.zeros(2), request["path"])
            return {"attn_implementation": "eager", "seconds": 1e-3, "bytes": 1}

        def close(self):
            pass

    started = []
    monkeypatch.setattr(run, "Worker", Failing)
    args = argparse.Namespace(threads=1, keep_freed_memory=False, device="cpu", attn_implementation="sdpa",
                              quick=True, rounds=1, warmup=0, autocast="bf16", legacy_python=None,
                              configs=["issue"])  # fmt: skip
    bench = run.Run(args, tmp_path)
    case = run.QUICK_CASES[1]  # (XLNet: the reference, transformers 5, runs in this python)
    run.measure_throughput(bench, case, tmp_path, memory=True)
    assert [worker.autocast for worker in started] == ["bf16", "bf16"]
    assert [row["section"] for row in bench.rows] == ["throughput"] * 3 + ["memory"]
    for row in bench.rows:
        ours, reference = row["sides"].values()
        assert reference == {"status": "failed", "error": "OutOfMemoryError: CUDA out of memory."}, row["workload"]
        assert ours["status"] == ("measured" if row["section"] == "memory" else "not measured") and row["ratio"] is None
    run.write_results(bench, tmp_path / "out", finished=False)
    assert json.loads((tmp_path / "out" / "results.json").read_text())["finished"] is False
    assert (tmp_path / "out" / "results.md").read_text().startswith("(the run had not finished")


def test_autocast_refuses_the_workloads_it_does_not_apply_to(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import run

    monkeypatch.setattr(sys, "argv", ["run.py", "--autocast", "bf16", "--workloads", "throughput", "deploy"])
    with pytest.raises(SystemExit):
        run.main()
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.endswith("--autocast bf16 measures the peak, throughput, memory workloads only, not deploy")


def test_keep_freed_memory_reaches_every_timed_worker_but_not_the_memory_measurement(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import argparse

    import run

    started = []
    monkeypatch.setattr(run, "Worker", lambda *args, env=None: started.append(env))
    for keep in (False, True):
        args = argparse.Namespace(threads=2, keep_freed_memory=keep, device="cpu", attn_implementation="sdpa",
                                  autocast="off")  # fmt: skip
        bench = run.Run(args, tmp_path)
        bench.worker(tmp_path, "ours")
        bench.worker(tmp_path, "legacy", "python", env=run.MALLOC_ENV)
    assert started == [None, run.MALLOC_ENV, run.KEEP_FREED_MEMORY_ENV, run.MALLOC_ENV]
    assert run.KEEP_FREED_MEMORY_ENV["MALLOC_MMAP_MAX_"] == "0"


@pytest.mark.parametrize("quick", [False, True])
def test_deploy_and_bf16_sides_each_start_a_worker_but_share_one_with_quick(monkeypatch, tmp_path, quick):
    """The full run times each deploy side, and each bf16 workload, in a worker of its own; --quick (a smoke test)
    asks one worker per case for all, and adds the pretrained-shape decoding row from it (the tiny case stands for
    those shapes). Every worker is closed. (Recording workers that answer at once: no processes.)"""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import argparse

    import run

    class Recording:
        def __init__(self, *args, env=None):
            self.variants, self.closed = [], False
            started.append(self)

        def ask(self, request):
            self.variants.append(request.get("variant"))
            return {"max_abs_diff": 0.0, "seconds": 1e-3}

        def close(self):
            self.closed = True

    started = []
    monkeypatch.setattr(run, "Worker", Recording)
    monkeypatch.setattr(run, "DEPLOY_PAUSE", 0.0)
    args = argparse.Namespace(threads=1, keep_freed_memory=False, device="cpu", attn_implementation="sdpa",
                              quick=quick, rounds=1, warmup=0, autocast="off")  # fmt: skip
    bench = run.Run(args, tmp_path)
    case = run.deploy_cases(quick)[0]
    run.measure_deploy(bench, case, tmp_path, pretrained_shape=quick)
    sides = [side for side in run.DEPLOY_SIDES if side not in run.unmeasured_deploy_sides(args)]
    if quick:
        assert len(started) == 1 and set(started[0].variants) == set(sides)
    else:  # (each worker asked only about its own side)
        assert [set(worker.variants) for worker in started] == [{side} for side in sides]
    assert all(worker.closed for worker in started)
    workloads = [row["workload"] for row in bench.rows]
    decoding = ["greedy decoding, prompt 64, batch 1"] + ([run.PRETRAINED_DECODE] if quick else [])
    assert workloads[0].startswith("segment") and workloads[1:] == decoding
    if quick:  # (the pretrained row's differences: its decoding variants')
        assert bench.rows[-1]["max_abs_logit_diff"].keys() == set(run.DECODE_SIDES) & set(sides) - {"eager"}
    started.clear()
    run.measure_variants(bench, case, tmp_path, "bf16")
    assert len(started) == (1 if quick else 2) and all(worker.closed for worker in started)


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
    positions = [layer.rel_attn.r.weight for layer in xlnet.transformer.layer]
    assert bench_generation.streamed_weight_bytes(xlnet) == size(xlnet.parameters()) - size(positions)
    for tie in (True, False):
        txl = TransfoXLLMHeadModel(TransfoXLConfig(vocab_size=50, cutoffs=[10, 30], d_model=16, d_embed=16, n_head=2,
                                                   d_head=8, d_inner=32, n_layer=2, tie_weight=tie))
        skipped = [layer.dec_attn.r_net.weight for layer in txl.transformer.layers]
        if not tie:
            skipped += [layer.weight for layer in txl.transformer.word_emb.emb_layers]
        assert bench_generation.streamed_weight_bytes(txl) == size(txl.parameters()) - size(skipped), tie


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


def test_device_helpers_take_the_cuda_functions_on_a_cuda_device(monkeypatch):
    """On CUDA, timed calls wait for the device before and after (torch.cuda.synchronize) and peak memory is the
    allocator's (max_memory_allocated over memory_allocated before, its peak reset first); on CPU none of the CUDA
    functions is called. (No GPU here: torch.cuda's functions are replaced by recording ones.)"""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import devices
    import timing

    calls = []

    def record(name, value=None):
        return lambda *args: calls.append((name, *map(str, args))) or value

    monkeypatch.setattr(torch.cuda, "synchronize", record("synchronize"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", record("reset_peak_memory_stats"))
    monkeypatch.setattr(torch.cuda, "memory_allocated", record("memory_allocated", 1000))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", record("max_memory_allocated", 5000))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    assert devices.parse_device("cuda") == torch.device("cuda")
    assert timing.seconds(lambda: calls.append(("call",)), device="cuda") >= 0
    assert calls == [("synchronize", "cuda"), ("call",), ("synchronize", "cuda")]
    calls.clear()
    assert devices.peak_memory(lambda: calls.append(("step",)), torch.device("cuda:0")) == 4000
    assert [call[0] for call in calls] == ["synchronize", "reset_peak_memory_stats", "memory_allocated", "step",
                                           "synchronize", "max_memory_allocated"]  # fmt: skip
    assert all(call[1:] == ("cuda:0",) for call in calls if call[0] != "step")
    calls.clear()
    timing.seconds(lambda: None, device="cpu")
    assert devices.peak_memory(lambda: torch.ones(1 << 20).sum(), "cpu") >= 0
    assert calls == []


def test_parse_device_names_what_is_wrong_in_one_line(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import devices

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for name, cause in (("cuda", "sees no CUDA device"), ("meta", "measure cpu, cuda only"),
                        ("gpu", "not a torch device")):  # fmt: skip
        with pytest.raises(ValueError, match=cause) as error:
            devices.parse_device(name)
        assert str(error.value).startswith(f"--device {name}: ") and "\n" not in str(error.value)
    assert devices.parse_device("cpu") == torch.device("cpu")


def test_attention_implementation_falls_back_to_eager_where_a_model_lacks_the_requested_one():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from devices import attention_implementation
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))

    class SdpaOnly:
        _supports_sdpa, _supports_flex_attn = True, False

    assert [attention_implementation(SdpaOnly, name) for name in ("eager", "sdpa", "flex_attention")] == [
        "eager", "sdpa", "eager"]  # fmt: skip
    assert attention_implementation(object, "sdpa") == "eager"  # (transformers 4.37.2's Transformer-XL has no flags)


def test_check_device_counts_host_syncs_on_cpu():
    """benchmarks/check_device.py, which the first machine with a GPU runs, through the same device switch on CPU:
    its host-sync checks pass here (the agreement it also checks is tests/test_attention_*.py's), and its counter
    sees an `.item()`."""
    spec = importlib.util.spec_from_file_location("check_device", ROOT / "benchmarks" / "check_device.py")
    check_device = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check_device)
    lines = []
    report = lambda passed, line: lines.append((passed, line))  # noqa: E731
    device = torch.device("cpu")
    for model in ("transfo-xl", "xlnet"):
        check_device.check_host_syncs(model, device, report)
    assert [passed for passed, _ in lines] == [True] * 4, lines
    assert "transfo-xl training step: host syncs 2 by dispatch (at most 2)" in lines[0][1]

    syncing = lambda: torch.ones(1).item()  # noqa: E731
    assert check_device.count_syncs(syncing, device) == (1, None)


def test_memory_breakdown_tracks_what_is_alive_at_the_peak_and_what_autograd_saved(monkeypatch):
    """`memory_breakdown.StorageTracker`: new storages count from their making to their freeing (views and in-place
    results add nothing), the peak keeps what was alive then, and the saved-tensor hook marks what autograd saved."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import memory_breakdown

    kib = 1024
    weight = torch.randn(256, 256, requires_grad=True)  # (made before: not counted)
    tracker = memory_breakdown.StorageTracker()
    with tracker, torch.autograd.graph.saved_tensors_hooks(tracker.mark_saved, lambda tensor: tensor):
        hidden = torch.ones(64, 256) @ weight  # 64 KiB; the ones (64 KiB) saved for the weight's gradient
        out = hidden.tanh()  # 64 KiB, saved (tanh's backward reads its output)
        out.t().mul_(2)  # (a view, in place: nothing new)
        del hidden
        temporary = torch.zeros(128, 256)  # 128 KiB
        del temporary
    assert tracker.bytes == 128 * kib  # the ones and `out`
    assert tracker.peak == 256 * kib  # the ones, `out` and the temporary
    assert sorted((size, saved) for size, _, saved in tracker.at_peak.values()) == [
        (64 * kib, True), (64 * kib, True), (128 * kib, False)
    ]


def test_profile_step_counts_the_gemm_flops_of_an_xlnet_training_step(monkeypatch):
    """`profile_step.FlopCounter` counts a training step whose backward calls `autograd.grad` (XLNet's recomputed
    feed-forward activation), where `FlopCounterMode` fails, and gives FlopCounterMode's count where both run."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import profile_step
    from torch.utils.flop_counter import FlopCounterMode

    from transformers_xl import XLNetConfig, XLNetLMHeadModel

    torch.manual_seed(0)
    config = XLNetConfig(vocab_size=50, d_model=16, n_layer=1, n_head=2, d_inner=32, dropout=0.0)
    model, ids = XLNetLMHeadModel(config).train(), torch.randint(0, 50, (2, 8))
    with profile_step.FlopCounter() as counter:
        model(ids, labels=ids).loss.backward()
    feed_forward = 3 * 4 * 2 * 8 * 16 * 32  # (forward + backward) x its two products
    assert sum(counter.counts.values()) > feed_forward
    layer, hidden = torch.nn.Linear(16, 32), torch.randn(4, 16, requires_grad=True)
    with profile_step.FlopCounter() as ours, FlopCounterMode(display=False) as torch_count:
        layer(hidden).sum().backward()
    assert sum(ours.counts.values()) == torch_count.get_total_flops() == 3 * 2 * 4 * 16 * 32
