"""``python -m fattn.bench``: see fattn.bench.cli."""
import sys

from .cli import main

sys.exit(main())
