"""The command: `python -m fattn.selftest [--json PATH] [--no-record] [--kernels k1,k2]
[--quick]` (the package's docstring says what it does)."""
from __future__ import annotations

import argparse
import sys

import fattn.selftest

from .suite import Options, run


def parse(argv) -> Options:
    p = argparse.ArgumentParser(prog="python -m fattn.selftest",
                                description=fattn.selftest.__doc__.split("\n\n")[0])
    p.add_argument("--json", metavar="PATH", help="write the full report (environment, rows, "
                   "every case's errors) as JSON")
    p.add_argument("--no-record", action="store_true",
                   help="write no verification records")
    p.add_argument("--kernels", metavar="K1,K2", help="only these kernels of the table")
    p.add_argument("--quick", action="store_true", help="a smaller grid")
    args = p.parse_args(argv)
    names = [k.strip() for k in args.kernels.split(",") if k.strip()] if args.kernels else None
    return Options(json=args.json, record=not args.no_record, kernels=names, quick=args.quick)


def main(argv=None) -> int:
    options = parse(argv)
    try:
        report = run(options)
    except ValueError as e:  # the arguments (an unknown kernel)
        print(f"fattn.selftest: {e}", file=sys.stderr)
        return 2
    return report["exit_status"]


if __name__ == "__main__":
    sys.exit(main())
