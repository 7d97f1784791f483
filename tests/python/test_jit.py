"""fattn.jit: the same sources through torch.utils.cpp_extension.load, in one process with
the installed package, without registering an operator twice.

The first build takes a minute or two (2 cores); it is kept in ~/.cache/fattn/jit (or
$FATTN_JIT_DIR), so later runs only load it. FATTN_TEST_JIT=0 skips these tests."""
import glob
import json
import os
import platform
import shutil
import subprocess

import pytest

from conftest import run_python

pytestmark = pytest.mark.skipif(os.environ.get("FATTN_TEST_JIT", "1") == "0",
                                reason="FATTN_TEST_JIT=0")


@pytest.fixture(scope="module")
def jit_result():
    out = run_python("""
        import json, torch, fattn
        ext = fattn.jit.load()
        again = fattn.jit.load()
        r = {"same_object": ext is again, "namespace": ext.namespace,
             "version": ext.ext.version(), "package_version": fattn.__version__,
             "isa": ext.ext.best_cpu_isa(), "package_isa": fattn.best_cpu_isa(),
             "build_directory": ext.build_directory,
             "so": [str(m) for m in [ext.ext.__file__]]}
        # the installed package's operator and the JIT one live side by side
        g = torch.Generator().manual_seed(0)
        cases = []
        for (b, hq, hkv, sq, sk, d, causal, right) in [(2, 4, 2, 65, 113, 64, True, False),
                                                     (1, 2, 2, 7, 7, 128, True, True),
                                                     (2, 8, 8, 200, 150, 32, False, False)]:
            q = torch.randn(b, sq, hq, d, generator=g).transpose(1, 2)
            k = torch.randn(b, hkv, sk, d, generator=g)
            v = torch.randn(b, hkv, sk, d, generator=g)
            a_out, a_lse = torch.ops.fattn.attention(q, k, v, causal, right)
            b_out, b_lse = torch.ops.fattn_jit.attention(q, k, v, causal, right)
            cases.append(bool(torch.equal(a_out, b_out) and torch.equal(a_lse, b_lse)))
        r["bitwise_equal"] = cases
        # the bound Python API
        q, k, v = (torch.randn(1, 4, 33, 64, generator=g) for _ in range(3))
        r["sdpa_err"] = (ext.scaled_dot_product_attention(q, k, v, is_causal=True)
                         - torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                         ).abs().max().item()
        # the KV-cache and varlen entry points bound to the JIT build's operators
        kc, vc = (torch.randn(2, 32, 2, 64, generator=g) for _ in range(2))
        qd = torch.randn(2, 1, 4, 64, generator=g)
        lens = torch.tensor([3, 32], dtype=torch.int32)
        cu = torch.tensor([0, 5, 12], dtype=torch.int32)
        qv, kv, vv = (torch.randn(12, 2, 32, generator=g) for _ in range(3))
        r["kv_bitwise_equal"] = [
            bool(torch.equal(fattn.flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=lens),
                             ext.flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=lens))),
            bool(torch.equal(fattn.flash_attn_varlen_func(qv, kv, vv, cu, cu, 7, 7, causal=True),
                             ext.flash_attn_varlen_func(qv, kv, vv, cu, cu, 7, 7, causal=True)))]
        # the fake kernel and autograd registration of the JIT namespace
        torch.library.opcheck(torch.ops.fattn_jit.attention.default, (q, k, v), {"is_causal": True})
        r["opcheck"] = True
        # the namespace the installed package owns cannot be taken
        try:
            fattn.jit.load(namespace="fattn")
            r["fattn_ns"] = "loaded"
        except RuntimeError as e:
            r["fattn_ns"] = str(e)
        try:
            fattn.jit.load(namespace="not a name")
            r["bad_ns"] = "loaded"
        except ValueError as e:
            r["bad_ns"] = str(e)
        print(json.dumps(r))
    """, timeout=900)
    return json.loads(out.strip().splitlines()[-1])


def test_jit_loads_once(jit_result):
    assert jit_result["same_object"]
    assert jit_result["namespace"] == "fattn_jit"


def test_jit_matches_the_installed_operator(jit_result):
    assert jit_result["version"] == jit_result["package_version"]
    assert jit_result["isa"] == jit_result["package_isa"]
    # same sources, same per-ISA code generation: the same bits
    assert all(jit_result["bitwise_equal"]), jit_result["bitwise_equal"]
    assert all(jit_result["kv_bitwise_equal"]), jit_result["kv_bitwise_equal"]
    assert jit_result["sdpa_err"] < 1e-5
    assert jit_result["opcheck"]


def test_jit_refuses_a_taken_namespace(jit_result):
    assert "already registered" in jit_result["fattn_ns"]
    assert "must be an identifier" in jit_result["bad_ns"]


@pytest.mark.skipif(platform.machine() != "x86_64" or shutil.which("objdump") is None,
                    reason="x86-64 with objdump only")
def test_jit_kernels_use_each_instruction_set(jit_result):
    # The #pragma GCC target route emits the same wide instructions as CMake's -m flags.
    def count(path, reg):
        dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", path], capture_output=True,
                             text=True, check=True).stdout
        return dis.count(reg)

    import fattn
    installed = glob.glob(os.path.join(os.path.dirname(fattn.__file__), "_C*.so"))[0]
    jit = jit_result["so"][0]
    for reg in ("%zmm", "%ymm"):
        a, b = count(installed, reg), count(jit, reg)
        assert a > 500 and b > 500, (reg, a, b)
        assert 0.5 < a / b < 2.0, (reg, a, b)


def test_jit_second_process_reuses_the_build(jit_result):
    out = run_python("""
        import time, torch, fattn
        t = time.monotonic()
        ext = fattn.jit.load()
        print(time.monotonic() - t)
    """)
    assert float(out.strip().splitlines()[-1]) < 30  # no recompilation
