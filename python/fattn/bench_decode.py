"""``python -m fattn.bench_decode``: the decode benchmark, fattn.bench.decode (also
``python -m fattn.bench --decode``)."""
import sys

from .bench.decode import main

if __name__ == "__main__":
    sys.exit(main())
