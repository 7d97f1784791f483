"""REPORT.md and its figures, generated from the JSON results: ``python -m report``.

Every figure in the prose is computed here from the JSON files (sources.py lists them);
nothing is typed in by hand. scripts/report.sh runs the measurements and then this.
"""
