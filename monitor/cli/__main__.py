"""``python -m monitor.cli ...``: the ``monitor`` command."""

import sys

from monitor.cli.main import main

sys.exit(main())
