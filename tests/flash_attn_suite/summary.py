"""The JSON summary of a run of FlashAttention's test file against fattn
(scripts/fa-tests.sh): counts, skips by reason, per test function, failures' ids."""
import argparse
import collections
import datetime
import json
import platform
import subprocess
import xml.etree.ElementTree as ET

import torch

import fattn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("junit")
    ap.add_argument("--version", required=True)
    ap.add_argument("--sample", type=int, default=1)
    ap.add_argument("--select", default="")
    ap.add_argument("--machine", default=platform.node())
    ap.add_argument("--path", default="cpu")
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    per_test = collections.defaultdict(collections.Counter)
    skips, failures, totals = collections.Counter(), [], collections.Counter()
    for case in ET.parse(a.junit).getroot().iter("testcase"):
        name = case.get("name")
        function = name.split("[")[0]
        if case.find("failure") is not None or case.find("error") is not None:
            outcome = "failed"
            failures.append(name)
        elif case.find("skipped") is not None:
            outcome = "skipped"
            skips[case.find("skipped").get("message", "").strip() or "(no reason)"] += 1
        else:
            outcome = "passed"
        per_test[function][outcome] += 1
        totals[outcome] += 1
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    summary = {
        "flash_attn_tests": f"flash-attn {a.version} tests/test_flash_attn.py",
        "date": datetime.date.today().isoformat(), "machine": a.machine,
        "cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
        "torch": torch.__version__, "fattn": fattn.__version__, "commit": commit,
        "path": a.path, "sample": f"1 in {a.sample}", "select": a.select or None,
        "cases": sum(totals.values()), "passed": totals["passed"], "failed": totals["failed"],
        "skipped": totals["skipped"], "skipped_by_reason": dict(skips.most_common()),
        "per_test": {k: dict(v) for k, v in sorted(per_test.items())}, "failures": failures,
    }
    with open(a.json, "w") as f:
        json.dump(summary, f, indent=1)
    print(f"fa-tests: {summary['cases']} cases: {totals['passed']} passed, "
          f"{totals['failed']} failed, {totals['skipped']} skipped")


if __name__ == "__main__":
    main()
