"""`python -m transformers_xl` is the `transformers-xl` command."""

import sys

from .cli import main

sys.exit(main())
