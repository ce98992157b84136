"""`python -m transformers_xl_cli` is the `transformers-xl` command."""

import sys

from . import console_main

sys.exit(console_main())
