"""The measuring half of scripts/llama-check.sh: llama-bench with and without the fattn
backend (same binaries, alternated), the logits against llama.cpp's non-flash path, a
llama-server request; writes llama-check.json and llama-check.md into --out."""
import argparse
import json
import os
import platform
import random
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

FATTN_COUNT = re.compile(r"ggml-fattn: (\d+) FLASH_ATTN_EXT nodes on fattn, (\d+) on ggml's CPU kernel")


def say(msg):
    print(f"llama-check: [{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def env_for(backend, with_fattn):
    env = dict(os.environ)
    env.pop("GGML_BACKEND_PATH", None)
    if with_fattn:
        env.update(GGML_BACKEND_PATH=backend, GGML_FATTN_VERBOSE="1")
    return env


def nodes_on_fattn(stderr):
    return sum(int(m[1]) for m in FATTN_COUNT.finditer(stderr))


def bench(a, model, cache, depth, with_fattn):
    cmd = [f"{a.llama_bin}/llama-bench", "-m", model, "-t", str(a.threads), "-fa", "1",
           "-p", "512", "-n", "128", "-d", str(depth), "-ctk", cache, "-ctv", cache,
           "-r", str(a.reps), "-o", "json"]
    run = subprocess.run(cmd, env=env_for(a.backend, with_fattn), capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{run.stderr[-2000:]}")
    rows = json.loads(run.stdout)
    return {("pp512" if r["n_prompt"] else "tg128"): r["avg_ts"] for r in rows}, nodes_on_fattn(run.stderr)


def text_file(path, words):
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    with open(path, "w") as fh:
        fh.write(" ".join("".join(rng.choice(letters) for _ in range(rng.randint(1, 3)))
                          for _ in range(words)))


def kld(a, model, text, base, mode):
    """llama-perplexity's KL divergence against the non-flash logits saved in base."""
    cmd = [f"{a.llama_bin}/llama-perplexity", "-m", model, "-f", text, "-c", "2048",
           "-t", str(a.threads), "--kl-divergence-base", base]
    cmd += ["-fa", "off"] if mode == "base" else ["-fa", "on", "--kl-divergence"]
    run = subprocess.run(cmd, env=env_for(a.backend, mode == "fattn"), capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{run.stderr[-2000:]}")
    if mode == "base":
        return None
    out = run.stdout + run.stderr
    stats = {}
    for key, label in (("mean_kld", r"Mean\s+KLD"), ("max_kld", r"Maximum KLD"),
                       ("rms_dp_percent", r"RMS Δp"), ("same_top_p_percent", r"Same top p")):
        m = re.search(label + r":\s+(-?[0-9.eE+-]+)", out)
        stats[key] = float(m[1]) if m else None
    stats["nodes_on_fattn"] = nodes_on_fattn(run.stderr)
    return stats


def server_request(a, model):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [f"{a.llama_bin}/llama-server", "-m", model, "-t", str(a.threads), "-fa", "on",
           "-c", "4096", "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env_for(a.backend, True), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(240):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        body = json.dumps({"prompt": "a b c d e f g " * 40, "n_predict": 24, "stream": True}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=body,
                                     headers={"Content-Type": "application/json"})
        chunks, first = 0, None
        start = time.time()
        with urllib.request.urlopen(req, timeout=300) as r:
            for line in r:
                if line.startswith(b"data: ") and b'"content"' in line:
                    chunks += 1
                    first = first or time.time() - start
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    return {"streamed_chunks": chunks, "first_chunk_s": first, "nodes_on_fattn": nodes_on_fattn(err)}


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    for name in ("llama-bin", "backend", "work", "out", "machine", "depths", "models", "caches",
                 "llama-version"):
        ap.add_argument("--" + name, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    result = {"machine": a.machine, "cpu": platform.processor() or platform.machine(),
              "threads": a.threads, "llama_cpp": f"llama-cpp-python {a.llama_version} (vendored tree)",
              "date": time.strftime("%Y-%m-%d"), "rows": []}
    with open(f"{a.work}/test-backend-ops.json") as fh:
        result["test_backend_ops"] = json.load(fh)
    head_dim = {"llama3-8b": 128, "llama3.2-1b": 64}
    order = 0
    for shape in a.models.split(","):
        model = f"{a.work}/{shape}-q4_k_m.gguf"
        for depth in (int(d) for d in a.depths.split(",")):
            for cache in a.caches.split(","):
                say(f"llama-bench {shape} depth {depth} cache {cache}")
                runs = {}
                for with_fattn in ((True, False) if order % 2 == 0 else (False, True)):
                    runs[with_fattn] = bench(a, model, cache, depth, with_fattn)
                order += 1
                for test in ("pp512", "tg128"):
                    fattn, ggml = runs[True][0][test], runs[False][0][test]
                    result["rows"].append({
                        "model": f"{shape} (Q4_K_M, random weights)", "head_dim": head_dim[shape],
                        "cache_type": cache, "depth": depth, "test": test,
                        "tokens_per_s_fattn": fattn, "tokens_per_s_ggml": ggml,
                        "speedup": fattn / ggml, "nodes_on_fattn": runs[True][1]})
                    say(f"  {test}: fattn {fattn:.2f} t/s, ggml {ggml:.2f} t/s ({fattn / ggml:.2f}x)")
    shape = a.models.split(",")[0]
    model = f"{a.work}/{shape}-q4_k_m.gguf"
    say(f"logits vs the non-flash path ({shape}, 2 chunks of 2048 tokens)")
    text, base = f"{a.work}/text.txt", f"{a.work}/{shape}-base.kld"
    text_file(text, 2500)
    kld(a, model, text, base, "base")
    result["logits"] = {"model": shape, "context": 2048,
                        "ggml_flash_vs_non_flash": kld(a, model, text, base, "ggml"),
                        "fattn_vs_non_flash": kld(a, model, text, base, "fattn")}
    say("llama-server: a streamed request")
    result["server"] = server_request(a, model)
    os.makedirs(a.out, exist_ok=True)
    with open(f"{a.out}/llama-check.json", "w") as fh:
        json.dump(result, fh, indent=1)
    lines = ["| model | D | cache | depth | test | fattn t/s | ggml t/s | fattn/ggml |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in result["rows"]:
        lines.append(f"| {r['model']} | {r['head_dim']} | {r['cache_type']} | {r['depth']} | {r['test']} | "
                     f"{r['tokens_per_s_fattn']:.2f} | {r['tokens_per_s_ggml']:.2f} | {r['speedup']:.2f} |")
    with open(f"{a.out}/llama-check.md", "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(json.dumps({k: result[k] for k in ("test_backend_ops", "logits", "server")}, indent=1))


if __name__ == "__main__":
    main()
