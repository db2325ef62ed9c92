"""``python -m rlsched.cli``: the same command line as the ``rlsched`` entry point."""

import sys

from rlsched.cli import main

sys.exit(main())
