"""``python -m registry.daemon``: run the dispatch daemon in the foreground."""

import sys

from registry.daemon.server import main

sys.exit(main())
