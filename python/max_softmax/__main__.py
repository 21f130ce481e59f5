"""`python -m max_softmax` runs the `softmax` command."""

import sys

from .cli import main

sys.exit(main())
