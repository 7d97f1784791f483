"""python -m fattn.bench --decode --quick: runs beside torch SDPA and writes decode.json."""
import json
import subprocess
import sys


def test_bench_decode_quick(tmp_path):
    p = subprocess.run([sys.executable, "-m", "fattn.bench", "--decode", "--quick", "--out",
                        str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    doc = json.loads((tmp_path / "decode.json").read_text())
    assert doc["machine"]["bandwidth_gbs"] > 0
    assert [(r["Sq"], r["Sk"]) for r in doc["decode"]] == [(1, 256), (4, 256)]
    for r in doc["decode"]:
        assert r["fattn_ms"] > 0 and r["torch_sdpa_ms"] > 0
        # float32 against float64: both well inside float32's rounding of a softmax average
        assert r["fattn_max_abs_err"] < 1e-5 and r["torch_max_abs_err"] < 1e-5
    assert "| 1 | 8 | 2 | 64 | 1 | 256 |" in p.stdout
