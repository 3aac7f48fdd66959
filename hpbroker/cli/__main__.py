"""``python -m hpbroker.cli``: the ``hpbroker`` command."""

import sys

from hpbroker.cli import main

sys.exit(main())
