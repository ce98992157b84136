"""Decoding steps run on one thread per core that other processes leave idle (decoding_threads.py): the policy from
CPU-time readings, a real reading beside a busy process, and generate() switching threads per step and back."""

import subprocess
import sys
import time

import pytest
import torch

from transformers_xl.modeling import decoding_threads
from transformers_xl.modeling.decoding_threads import CpuTimes, IdleCores, others_busy, read_cpu_times


def readings(*others_per_window, cores=2, window=IdleCores.WINDOW, running=0):
    """A fake `read`: consecutive readings one window apart in which other processes used the given cores on average
    and this process one core; `running` threads of others runnable at each reading."""
    when, busy, own = 0.0, 0.0, 0.0
    yield CpuTimes(when, busy, own, cores, running)
    for others in others_per_window:
        when, busy, own = when + window, busy + (others + 1) * window, own + window
        yield CpuTimes(when, busy, own, cores, running)


@pytest.mark.parametrize(
    "others, cores, idle",
    [
        (0.0, 2, 2),  # a quiet machine
        (0.05, 2, 2),  # its daemons
        (0.3, 2, 2),
        (0.4, 2, 1),  # a busy loop that our two spinning threads hold to part of a core
        (1.0, 2, 1),  # a busy loop
        (2.0, 2, 1),  # a second torch process on two threads: never fewer than one
        (1.5, 4, 2),
        (0.0, 8, 8),
    ],
)
def test_idle_cores_from_the_others_cpu_time(others, cores, idle):
    watch = IdleCores(readings(others, cores=cores, running=1).__next__, clock=lambda: float("inf"))
    assert watch() == cores - 1  # (no window yet: the threads others have runnable at the first step decide)
    assert watch() == idle


def test_idle_cores_keep_their_count_within_a_window_and_follow_the_next():
    """Steps at 0, 0.1, 0.3, 0.4 and 0.6 s: /proc/stat is read once a window has passed (at 0, 0.3 and 0.6 s)."""
    fake = iter([CpuTimes(0.0, 0.0, 0.0, 2, 1), CpuTimes(0.3, 0.3, 0.3, 2, 1), CpuTimes(0.6, 0.9, 0.5, 2, 0)])
    steps = iter([0.1, 0.3, 0.4, 0.6])
    watch = IdleCores(fake.__next__, clock=steps.__next__)
    # (one thread of others runnable at the first step; quiet over 0-0.3 s; others took a core over 0.3-0.6 s)
    assert [watch() for _ in range(5)] == [1, 1, 2, 2, 1]
    assert next(fake, None) is None and next(steps, None) is None


@pytest.mark.parametrize("running, idle", [(0, 2), (1, 1)])
def test_after_a_pause_what_runs_now_decides_not_the_pause(running, idle):
    """A reading 2 s after the last one, over which others kept a core busy (a process that has finished, such as the
    other side of an alternating benchmark), is no window: the threads of others runnable now decide."""
    fake = iter([CpuTimes(0.0, 0.0, 0.0, 2, 0), CpuTimes(2.0, 2.0, 0.0, 2, running)])
    watch = IdleCores(fake.__next__, clock=iter([2.0]).__next__)
    assert [watch(), watch()] == [2, idle]


def test_without_proc_stat_a_step_runs_on_one_thread():
    assert IdleCores(lambda: None)() == 1


@pytest.mark.skipif(read_cpu_times() is None, reason="no /proc/stat on this system")
def test_a_busy_process_is_seen_taking_a_core():
    """A real reading: a busy loop in another process takes most of a core over half a second."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        first = read_cpu_times()
        time.sleep(0.5)
        second = read_cpu_times()
    finally:
        busy.kill()
        busy.wait()
    assert others_busy(first, second) > 0.5
    assert second.others_running >= 1


# ----------------------------------------------------------------------------------------------------------------
# generate(): decoding steps on decoding_threads()


def tiny_language_models():
    from transformers_xl import TransfoXLConfig, TransfoXLLMHeadModel, XLNetConfig, XLNetLMHeadModel

    torch.manual_seed(0)
    txl = TransfoXLLMHeadModel(TransfoXLConfig(vocab_size=60, cutoffs=[20, 40], d_model=16, d_embed=16, n_head=2,
                                               d_head=8, d_inner=32, n_layer=2, mem_len=32, eos_token_id=None))
    xlnet = XLNetLMHeadModel(XLNetConfig(vocab_size=60, d_model=16, n_layer=2, n_head=2, d_inner=32))
    return {"transfo-xl": txl.eval(), "xlnet": xlnet.eval()}


@pytest.mark.parametrize("model_type", ["transfo-xl", "xlnet"])
def test_decoding_steps_run_on_decoding_threads_and_restore_the_setting(model_type, monkeypatch):
    """generate(): the prompt's forward pass keeps torch's thread count, every decoding step runs on the idle cores'
    count (or DECODING_THREADS's number), and the count is torch's again afterwards (also after a step that
    raised)."""
    model = tiny_language_models()[model_type]
    seen = []
    model.transformer.register_forward_pre_hook(lambda module, args: seen.append(torch.get_num_threads()))
    prompt = torch.randint(1, 60, (1, 20), generator=torch.Generator().manual_seed(0))
    previous = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        monkeypatch.setattr(decoding_threads, "idle_cores", lambda: 2)
        model.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=0)
        assert seen[0] == 3 and seen[1:] == [2] * (len(seen) - 1) and len(seen) >= 3
        assert torch.get_num_threads() == 3
        for setting, expected in [(1, {1}), (None, {3}), (8, {3})]:  # (never more than torch's setting)
            monkeypatch.setattr(decoding_threads, "DECODING_THREADS", setting)
            seen.clear()
            model.generate(prompt, max_new_tokens=3, do_sample=False, pad_token_id=0)
            assert set(seen[1:]) == expected and torch.get_num_threads() == 3
        monkeypatch.setattr(decoding_threads, "DECODING_THREADS", 1)
        model.transformer.register_forward_hook(lambda *_: (_ for _ in ()).throw(RuntimeError("failed step")))
        with pytest.raises(RuntimeError, match="failed step"):
            model.generate(prompt[:, :4], max_new_tokens=3, do_sample=False, pad_token_id=0)
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("setting", ["all", 0])
def test_an_unknown_setting_is_refused(setting, monkeypatch):
    monkeypatch.setattr(decoding_threads, "DECODING_THREADS", setting)
    expected = rf"DECODING_THREADS is {setting!r}; expected 'idle cores', a number of threads \(1 or more\) or None"
    with pytest.raises(ValueError, match=expected):
        decoding_threads.decoding_threads()
