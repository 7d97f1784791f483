"""python -m report [--results DIR] [--out DIR]: REPORT.md and figures from the JSON results."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import document, sources


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m report", description=sources.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", default="results/report", type=Path,
                   help="directory of the JSON results (default: results/report)")
    p.add_argument("--out", default=".", type=Path,
                   help="where REPORT.md and figures/ go (default: the current directory)")
    args = p.parse_args(argv)
    try:
        loaded = sources.load(args.results)
    except sources.ReportInputError as e:
        print(f"python -m report: {e}", file=sys.stderr)
        return 2
    path = document.write(loaded, args.out)
    print(f"wrote {path} and {args.out / document.FIGURES}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
