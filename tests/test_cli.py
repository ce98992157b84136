"""The `transformers-xl` command starts quietly and quickly: `--help` answers without importing torch or transformers,
nothing is printed on stderr by `import transformers_xl` or the command, the defaults its options write out agree with
the library's, and it prepares its own process (OpenMP's wait policy) without overriding the user's environment."""

import os
import subprocess
import sys
import sysconfig
import warnings
from pathlib import Path

import pytest

import transformers_xl_cli
from transformers_xl import hub_configs
from transformers_xl.conversion import hub_export
from transformers_xl.deployment import onnx_export
from transformers_xl.training import corpus, recipes
from transformers_xl_cli import convert, evaluate, export, train

COMMAND = Path(sysconfig.get_path("scripts")) / "transformers-xl"
HEAVY = ("torch", "transformers", "transformers_xl")


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["demo", "--help"], ["export", "--help"]])
def test_help_imports_neither_torch_nor_transformers(argv):
    result = run_python(
        "import sys, transformers_xl_cli\n"
        f"try:\n    transformers_xl_cli.main({argv!r})\nexcept SystemExit:\n    pass\n"
        f"print([name for name in {HEAVY!r} if name in sys.modules])"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "[]"


def test_a_bad_option_is_refused_before_torch_loads():
    result = run_python(
        "import sys, transformers_xl_cli\n"
        "try:\n    transformers_xl_cli.main(['demo', '--threads', '0'])\nexcept SystemExit as exit:\n"
        "    print(exit.code, 'torch' in sys.modules)"
    )
    assert result.stdout.split() == ["2", "False"] and "--threads: expected a positive integer" in result.stderr


QUIET = [[sys.executable, "-c", "import transformers_xl"], [str(COMMAND), "--help"], [str(COMMAND), "push", "--help"]]


@pytest.mark.parametrize("command", QUIET)
def test_import_and_help_print_nothing_on_stderr(command):
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stderr == ""


def test_the_written_out_defaults_agree_with_the_library():
    assert convert.DEFAULT_MAX_SHARD_SIZE == hub_export.DEFAULT_MAX_SHARD_SIZE
    assert convert.DEFAULT_TOLERANCE == hub_export.DEFAULT_TOLERANCE
    assert convert.RELEASED_CONFIGS == hub_configs.names()
    assert export.DEFAULT_TOLERANCE == onnx_export.DEFAULT_TOLERANCE
    assert export.DEFAULT_INT8_TOLERANCE == onnx_export.DEFAULT_INT8_TOLERANCE
    assert export.SUPPORTED_OPSETS == onnx_export.SUPPORTED_OPSETS
    assert evaluate.LINE_ENDS == sorted(corpus.LINE_ENDS)
    assert train.RECIPES == list(recipes.RECIPES)


def test_the_process_sleeps_its_waiting_threads_unless_the_user_said_otherwise():
    environment = {}
    transformers_xl_cli.prepare_process(environment)
    assert environment == {"OMP_WAIT_POLICY": "PASSIVE"}
    environment = {"OMP_WAIT_POLICY": "ACTIVE"}
    transformers_xl_cli.prepare_process(environment)
    assert environment == {"OMP_WAIT_POLICY": "ACTIVE"}


def test_the_command_prepares_its_process_before_torch_loads(tmp_path):
    """The executable sets OMP_WAIT_POLICY before a command imports torch (OpenMP reads it when it loads)."""
    seen = tmp_path / "seen"
    probe = tmp_path / "probe.py"  # (a stand-in for a command's work: what it finds when it starts)
    probe.write_text(
        "import os, sys\n"
        f"open({str(seen)!r}, 'w').write(f\"{{os.environ.get('OMP_WAIT_POLICY')}} {{'torch' in sys.modules}}\")\n"
    )
    code = (
        f"import runpy, sys, transformers_xl_cli\n"
        f"transformers_xl_cli.main = lambda: runpy.run_path({str(probe)!r}) and 0\n"
        "sys.exit(transformers_xl_cli.console_main())"
    )
    environment = {key: value for key, value in os.environ.items() if key != "OMP_WAIT_POLICY"}
    result = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert seen.read_text() == "PASSIVE False"


def test_deprecations_attributed_to_our_modules_fail_the_suite():
    """pyproject's filterwarnings: DeprecationWarning / FutureWarning raised from our modules are errors, others not."""
    for category in (DeprecationWarning, FutureWarning):
        for module in ("transformers_xl", "transformers_xl.modeling.quantization", "transformers_xl_cli.demo"):
            with pytest.raises(category):
                warnings.warn_explicit("deprecated", category, "ours.py", 1, module=module)
    with warnings.catch_warnings(record=True) as recorded:
        warnings.warn_explicit("deprecated", DeprecationWarning, "theirs.py", 1, module="torch.ao.quantization")
    assert len(recorded) == 1
