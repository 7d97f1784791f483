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


FIRST_ON_FATTN = "ggml-fattn: the first FLASH_ATTN_EXT node"
# llama.cpp's common tools (server, perplexity, cli) built without GGML_BACKEND_DL load
# backends from files (GGML_BACKEND_PATH) only where an argument makes them enumerate
# devices: a tensor override that matches no tensor does, and changes nothing else
# (docs/llama.md). Given to both sides alike. llama-bench loads them always.
LOAD_BACKENDS = ["-ot", "fattn-loads-backends=CPU"]


def nodes_on_fattn(stderr):
    """Nodes the backend ran, from its counts at exit (a process that exits without freeing
    its backends prints none: then 1 if the first node's line is there)."""
    counted = sum(int(m[1]) for m in FATTN_COUNT.finditer(stderr))
    return counted or int(FIRST_ON_FATTN in stderr)


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


def kld(a, model, text, base, mode, cache="f16"):
    """llama-perplexity's KL divergence against the non-flash logits saved in base (an F16
    cache: llama.cpp's non-flash path takes no quantized V), the flash runs with `cache`."""
    cmd = [f"{a.llama_bin}/llama-perplexity", "-m", model, "-f", text, "-c", "2048",
           "-t", str(a.threads), "--kl-divergence-base", base] + LOAD_BACKENDS
    cmd += ["-fa", "off"] if mode == "base" else ["-fa", "on", "--kl-divergence",
                                                  "-ctk", cache, "-ctv", cache]
    run = subprocess.run(cmd, env=env_for(a.backend, mode == "fattn"), capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{run.stderr[-2000:]}")
    if mode == "base":
        return None
    out = run.stdout + run.stderr
    stats = {}
    for key, label in (("mean_kld", r"Mean\s+KLD"), ("max_kld", r"Maximum KLD"),
                       ("rms_dp_percent", r"RMS Δp"), ("same_top_p_percent", r"Same top p")):
        m = re.search(label + r"\s*:\s+(-?[0-9.eE+-]+)", out)
        stats[key] = float(m[1]) if m else None
    stats["nodes_on_fattn"] = nodes_on_fattn(run.stderr)
    return stats


def server_request(a, model):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [f"{a.llama_bin}/llama-server", "-m", model, "-t", str(a.threads), "-fa", "on",
           "-c", "4096", "--host", "127.0.0.1", "--port", str(port)] + LOAD_BACKENDS
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
    ap.add_argument("--no-extras", action="store_true",
                    help="only llama-bench (no test-backend-ops, logits or server)")
    a = ap.parse_args()
    result = {"machine": a.machine, "cpu": platform.processor() or platform.machine(),
              "threads": a.threads, "llama_cpp": f"llama-cpp-python {a.llama_version} (vendored tree)",
              "date": time.strftime("%Y-%m-%d"), "rows": []}
    if not a.no_extras:
        with open(f"{a.work}/test-backend-ops.json") as fh:
            result["test_backend_ops"] = json.load(fh)
    head_dim = {"llama3-8b": 128, "llama3.2-1b": 64}
    order = 0
    for shape in a.models.split(","):
        model = f"{a.work}/{shape}-q4_k_m.gguf"
        for depth in (int(d) for d in a.depths.split(",") if d):
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
    if a.no_extras:
        return finish(a, result)
    say(f"logits vs the non-flash path ({shape}, 2 chunks of 2048 tokens)")
    text, base = f"{a.work}/text.txt", f"{a.work}/{shape}-base.kld"
    text_file(text, 5000)  # one token a word: 2 chunks of 2048 and more
    kld(a, model, text, base, "base")
    result["logits"] = {"model": shape, "context": 2048,
                        "ggml_flash_vs_non_flash": kld(a, model, text, base, "ggml"),
                        "fattn_vs_non_flash": kld(a, model, text, base, "fattn")}
    if "q8_0" in a.caches.split(","):  # the flash paths on a Q8_0 cache, against the same base
        say("logits with a Q8_0 cache vs the non-flash path (F16 cache)")
        result["logits_q8_0"] = {"model": shape, "context": 2048,
                                 "ggml_flash_vs_non_flash": kld(a, model, text, base, "ggml", "q8_0"),
                                 "fattn_vs_non_flash": kld(a, model, text, base, "fattn", "q8_0")}
    say("llama-server: a streamed request")
    result["server"] = server_request(a, model)
    return finish(a, result)


EXTRAS = ("test_backend_ops", "logits", "logits_q8_0", "server")


def finish(a, result):
    os.makedirs(a.out, exist_ok=True)
    path = f"{a.out}/llama-check.json"
    if os.path.exists(path):  # another run of the same day (other depths, caches or models)
        with open(path) as fh:
            earlier = json.load(fh)
        for k in EXTRAS:
            if k not in result and k in earlier:
                result[k] = earlier[k]
        keys = {(r["model"], r["cache_type"], r["depth"], r["test"]) for r in result["rows"]}
        result["rows"] = [r for r in earlier["rows"]
                          if (r["model"], r["cache_type"], r["depth"], r["test"]) not in keys] + result["rows"]
    with open(path, "w") as fh:
        json.dump(result, fh, indent=1)
    lines = ["| model | D | cache | depth | test | fattn t/s | ggml t/s | fattn/ggml |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in result["rows"]:
        lines.append(f"| {r['model']} | {r['head_dim']} | {r['cache_type']} | {r['depth']} | {r['test']} | "
                     f"{r['tokens_per_s_fattn']:.2f} | {r['tokens_per_s_ggml']:.2f} | {r['speedup']:.2f} |")
    with open(f"{a.out}/llama-check.md", "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(json.dumps({k: result.get(k) for k in EXTRAS}, indent=1))


if __name__ == "__main__":
    main()
