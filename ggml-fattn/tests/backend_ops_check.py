#!/usr/bin/env python3
"""ggml's test-backend-ops on FLASH_ATTN_EXT with the fattn backend loaded, as llama.cpp
loads it (GGML_BACKEND_PATH): every case compared with ggml's CPU kernel.

Fails when a case fails, or when a case fattn is meant to take (K/V f32, f16, bf16 or q8_0, one
type for both, equal head dims in [16, 256], no sparse mask) is left to ggml. Writes the
counts (and each refused case) to --json.
"""
import argparse
import json
import os
import re
import subprocess
import sys

ANSI = re.compile(r"\x1b\[[0-9;]*m")
CASE = re.compile(r"^\s*FLASH_ATTN_EXT\((?P<vars>.*)\): (?P<verdict>.*)$")
TAKEN_TYPES = {"f32", "f16", "bf16", "q8_0"}


def fields(text):
    """hsk=64,nr23=[4,1],type_K=f16,... as a dict of strings (brackets kept whole)."""
    out, depth, key, cur = {}, 0, None, ""
    for ch in text + ",":
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            k, _, v = cur.partition("=")
            out[k] = v
            cur = ""
        else:
            cur += ch
    return out


def fattn_takes(f):
    return (f["type_K"] == f["type_V"] and f["type_K"] in TAKEN_TYPES and f["hsk"] == f["hsv"]
            and 16 <= int(f["hsk"]) <= 256 and f.get("n_kv_max", "0") == "0")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--test-backend-ops", required=True)
    ap.add_argument("--backend", required=True, help="libggml-fattn.so")
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    env = dict(os.environ, GGML_BACKEND_PATH=args.backend)
    run = subprocess.run([args.test_backend_ops, "test", "-o", "FLASH_ATTN_EXT", "-b", "FATTN"],
                         env=env, capture_output=True, text=True)
    cases = on_fattn = passed = failed = 0
    refused, failures = [], []
    for line in ANSI.sub("", run.stdout).splitlines():
        m = CASE.match(line)
        if not m:
            continue
        cases += 1
        f, verdict = fields(m["vars"]), m["verdict"]
        if "not supported" in verdict:
            if fattn_takes(f):
                refused.append(m["vars"])
            continue
        on_fattn += 1
        if verdict.strip().startswith("OK"):
            passed += 1
        else:
            failed += 1
            failures.append(line.strip())
    result = {"cases": cases, "on_fattn": on_fattn, "passed": passed, "failed": failed,
              "refused_but_expected": refused, "failures": failures[:50],
              "exit_code": run.returncode}
    with open(args.json, "w") as fh:
        json.dump(result, fh, indent=1)
    print(f"test-backend-ops FLASH_ATTN_EXT: {cases} cases, {on_fattn} on fattn, "
          f"{passed} passed, {failed} failed, {len(refused)} left to ggml that fattn should take")
    for line in failures[:20]:
        print("  " + line)
    for v in refused[:20]:
        print("  refused: " + v)
    if cases == 0 or on_fattn == 0:
        print(run.stdout[-3000:], run.stderr[-3000:], sep="\n")
        return 1
    return 0 if failed == 0 and not refused and run.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
