"""A random-weight Llama GGUF with a real model's per-layer shapes, for measuring attention
inside llama.cpp (scripts/llama-check.sh): the attention and FFN shapes of the model it is
named for, fewer layers, a small vocabulary of byte tokens and pieces (SentencePiece
"llama" tokenizer, so any text tokenizes), float16 weights drawn N(0, 0.02²).

    python write_model.py --shape llama3-8b --layers 2 --out model-f16.gguf
"""
import argparse

import numpy as np

import gguf

# hidden, query heads, kv heads, head dim, FFN: the published configs' attention and MLP.
SHAPES = {
    "llama3-8b": dict(hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336),
    "llama3.2-1b": dict(hidden=2048, heads=32, kv_heads=8, head_dim=64, ffn=8192),
}
VOCAB = 32000


def vocabulary():
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256
    letters = "abcdefghijklmnopqrstuvwxyz"
    i = 0
    while len(tokens) < VOCAB:  # "▁a", "▁b", ..., "▁aa", ...: distinct pieces
        n, piece = i, ""
        while True:
            piece = letters[n % 26] + piece
            n = n // 26 - 1
            if n < 0:
                break
        tokens.append("\u2581" + piece)
        types.append(gguf.TokenType.NORMAL)
        i += 1
    scores = [0.0] * 3 + [0.0] * 256 + [-float(k) for k in range(VOCAB - 259)]
    return tokens, scores, types


def write(path, shape, layers, context):
    s = SHAPES[shape]
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name(f"random-{shape}-{layers}-layers")
    w.add_context_length(context)
    w.add_embedding_length(s["hidden"])
    w.add_block_count(layers)
    w.add_feed_forward_length(s["ffn"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
    w.add_rope_dimension_count(s["head_dim"])
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(VOCAB)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    tokens, scores, types = vocabulary()
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)

    def weight(rows, cols):  # numpy (out, in): ggml's ne = (in, out)
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    h, q, kv, ffn = s["hidden"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"], s["ffn"]
    w.add_tensor("token_embd.weight", weight(VOCAB, h))
    for i in range(layers):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", np.ones(h, dtype=np.float32))
        w.add_tensor(b + "attn_q.weight", weight(q, h))
        w.add_tensor(b + "attn_k.weight", weight(kv, h))
        w.add_tensor(b + "attn_v.weight", weight(kv, h))
        w.add_tensor(b + "attn_output.weight", weight(h, q))
        w.add_tensor(b + "ffn_norm.weight", np.ones(h, dtype=np.float32))
        w.add_tensor(b + "ffn_gate.weight", weight(ffn, h))
        w.add_tensor(b + "ffn_up.weight", weight(ffn, h))
        w.add_tensor(b + "ffn_down.weight", weight(h, ffn))
    w.add_tensor("output_norm.weight", np.ones(h, dtype=np.float32))
    w.add_tensor("output.weight", weight(VOCAB, h))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    write(a.out, a.shape, a.layers, a.context)


if __name__ == "__main__":
    main()
