"""Every ```python block of README.md and docs/*.md runs as written, offline.

Each block runs alone in a fresh interpreter, in an empty working folder, with the Hub ids and placeholder paths it
names (`placeholders`) replaced by local folders: tiny models of the same kind, or the test fixtures. A block that
truly needs the Hub or real training data is marked in its page by a comment on the line before its fence,
`<!-- readme-test: skip (the reason) -->`; `SKIPPED` counts them per page, so that the marks cannot silently grow.
A new block that names another Hub id or placeholder path fails here until it gets a local stand-in below.
"""

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
SKIP_MARK = re.compile(r"<!-- readme-test: skip \((?P<reason>[^)]+)\) -->")
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# the XLNet fine-tuning and pretraining recipes (their data and a Hub tokenizer); int8 quantization (torchao)
SKIPPED = {"docs/xlnet.md": 2, "docs/deployment.md": 1, "docs/training.md": 1}


def python_blocks(text: str):
    """[(line number of the fence, code, skip reason or None)] for every ```python fence that starts a line."""
    lines = text.splitlines()
    blocks, index = [], 0
    while index < len(lines):
        if lines[index].strip() == "```python":
            end = next(i for i in range(index + 1, len(lines)) if lines[i].strip() == "```")
            before = next((lines[i].strip() for i in range(index - 1, -1, -1) if lines[i].strip()), "")
            mark = SKIP_MARK.fullmatch(before)
            code = textwrap.dedent("\n".join(lines[index + 1 : end]))
            blocks.append((index + 1, code, mark["reason"] if mark else None))
            index = end
        index += 1
    return blocks


def page_name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


BLOCKS = [(page_name(page), line, code, reason)
          for page in PAGES for line, code, reason in python_blocks(page.read_text(encoding="utf-8"))]  # fmt: skip


def make_transfo_xl_folder(folder: Path):
    """A legacy transformers 4.x Transformer-XL folder: config.json, pytorch_model.bin holding every key, vocab.pkl.
    Vocabulary 20000, so that the Quick start's ids fit."""
    from transformers_xl import TransfoXLConfig, TransfoXLLMHeadModel

    torch.manual_seed(0)
    config = TransfoXLConfig(vocab_size=20000, cutoffs=[2000, 10000], d_model=16, d_embed=16, n_head=2, d_head=8,
                             d_inner=32, n_layer=2, mem_len=8, div_val=2)  # fmt: skip
    model = TransfoXLLMHeadModel(config)
    folder.mkdir()
    model.config.save_pretrained(folder)
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    shutil.copy(FIXTURES / "tokenizer" / "legacy" / "vocab.pkl", folder)


@pytest.fixture(scope="module")
def placeholders(tmp_path_factory):
    """README string -> the local folder that stands in for it."""
    transfo_xl = tmp_path_factory.mktemp("hub") / "transfo-xl-wt103"
    make_transfo_xl_folder(transfo_xl)
    return {
        "path/to/transfo-xl-wt103": transfo_xl,
        "transfo-xl/transfo-xl-wt103": transfo_xl,
        "path/to/my-text.txt": FIXTURES / "tokenizer" / "corpus.txt",  # 1,100 lines of prose, numbers, punctuation
        "xlnet/xlnet-base-cased": FIXTURES / "hf_legacy" / "xlnet_lm",  # a transformers XLNet LM with spiece.model
        "path/to/transformers-4.x-finetuned-folder": FIXTURES / "hf_legacy" / "xlnet_classifier",
    }


def substitute(code: str, placeholders: dict) -> str:
    for name, folder in placeholders.items():
        for quote in "\"'":
            code = code.replace(f"{quote}{name}{quote}", repr(str(folder)))
    return code


def test_the_pages_have_python_blocks_and_counted_skips():
    assert len([block for block in BLOCKS if not block[3]]) >= 7
    for page in PAGES:
        name = page_name(page)
        reasons = [reason for page_of, _, _, reason in BLOCKS if page_of == name and reason]
        expected = SKIPPED.get(name, 0)
        assert len(reasons) == expected, f"skipped blocks of {name} changed: {reasons}; run them, or update SKIPPED"
        marks = [line for line in page.read_text(encoding="utf-8").splitlines() if SKIP_MARK.fullmatch(line.strip())]
        assert len(marks) == expected, f"{name}: a skip mark that is not right before a ```python fence"


@pytest.mark.parametrize("page, line, code", [block[:3] for block in BLOCKS if not block[3]],
                         ids=[f"{page}:{line}" for page, line, _, reason in BLOCKS if not reason])  # fmt: skip
def test_readme_block_runs(page, line, code, placeholders, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(
        [sys.executable, "-c", substitute(code, placeholders)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"{page} line {line}:\n{code}\n--- stderr ---\n{result.stderr[-3000:]}"


def test_the_blocks_run_on_the_test_process_thread_count():
    """Each block's interpreter inherits OMP_NUM_THREADS (tests/conftest.py: one thread unless the variable says
    otherwise), not torch's default of one thread per core, which on a machine busy with the other test processes
    made a training block 4-5x slower."""
    assert os.environ.get("OMP_NUM_THREADS") == str(torch.get_num_threads())


LINK = re.compile(r"\]\((?P<target>[^)\s#]+\.(?:md|png))(?:#(?P<anchor>[^)\s]+))?\)")


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the page's headings: lower case, punctuation dropped, spaces as hyphens."""
    lines = page.read_text(encoding="utf-8").splitlines()
    headings = [line.lstrip("#").strip() for line in lines if line.startswith("#")]
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


@pytest.mark.parametrize("page", PAGES, ids=page_name)
def test_links_between_the_pages_resolve(page):
    """Every relative link of a page names a file that exists, and a heading of it where it names an anchor."""
    for link in LINK.finditer(page.read_text(encoding="utf-8")):
        target = (page.parent / link["target"]).resolve()
        assert target.is_file(), f"{page_name(page)}: broken link {link[0]}"
        if link["anchor"]:
            assert link["anchor"] in anchors(target), f"{page_name(page)}: no heading for {link[0]}"


def test_ci_runs_the_readmes_two_commands():
    """.ci/run runs the README's install-and-demo command (the demo with --quick) and its test command, as written."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), re.S)
    install, test = blocks[0].strip(), blocks[1].strip()
    assert install.endswith("transformers-xl demo")
    assert test == ". .venv/bin/activate && HF_HUB_OFFLINE=1 python -m pytest"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert install + " --quick" in ci and test in ci
