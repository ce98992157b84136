"""The `transformers-xl` command inside the package: `main(argv)` runs it in the calling process, as tests do.

The command itself lives in the package `transformers_xl_cli`, which parses options without importing torch (see
its docstring); this module is where code that already imported `transformers_xl` finds it.
"""

from transformers_xl_cli import main

__all__ = ["main"]
