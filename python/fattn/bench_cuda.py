"""``python -m fattn.bench_cuda``: fattn vs PyTorch SDPA on a GPU, fattn.bench.cuda."""
import sys

from .bench.cuda import main

if __name__ == "__main__":
    sys.exit(main())
