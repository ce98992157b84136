"""`python -m transformers_xl` is the `transformers-xl` command (torch loads first here: the package registers the
models when imported; `python -m transformers_xl_cli` is the same command without that)."""

import sys

from transformers_xl_cli import console_main

sys.exit(console_main())
