"""``python -m waferrt.cli``: the ``waferrt`` command."""

import sys

from waferrt.cli import main

sys.exit(main())
