"""``python -m metaq.client.cli``: the same as the ``metaq`` command."""

import sys

from metaq.client.cli import main

sys.exit(main())
