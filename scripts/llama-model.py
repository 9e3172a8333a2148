#!/usr/bin/env python3
"""Writes a llama-architecture GGUF model with random F16 weights (fixed
seed, so the file is the same on every run), its tokenizer copied from a
vocab-only GGUF (llama.cpp ships models/ggml-vocab-llama-spm.gguf). The
model says nothing sensible; it exercises llama.cpp's compute and KV state
exactly as a trained one of the same shape would.

  llama-model.py --vocab V.gguf --layers 4 --width 256 --heads 4 \
      --kv-heads 2 --ffn 704 --out model.gguf
Needs PyPI gguf (0.19) and numpy.
"""
import argparse

import numpy as np
import gguf


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=704)
    ap.add_argument("--context", type=int, default=16384)
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()

    reader = gguf.GGUFReader(a.vocab)
    tokens = reader.fields["tokenizer.ggml.tokens"]
    n_vocab = len(tokens.data)
    head_dim = a.width // a.heads

    w = gguf.GGUFWriter(a.out, "llama")
    w.add_name("kvtier random llama %dx%d" % (a.layers, a.width))
    w.add_context_length(a.context)
    w.add_embedding_length(a.width)
    w.add_block_count(a.layers)
    w.add_feed_forward_length(a.ffn)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.kv_heads)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, field.contents(), vtype, sub)

    rng = np.random.default_rng(a.seed)

    def weight(*shape, scale=None):
        # Scaled like a trained model's so activations stay in range.
        s = scale if scale is not None else 1.0 / np.sqrt(shape[-1])
        return (rng.standard_normal(shape, dtype=np.float32) * s).astype(np.float16)

    kv = a.kv_heads * head_dim
    w.add_tensor("token_embd.weight", weight(n_vocab, a.width, scale=0.02))
    for i in range(a.layers):
        p = "blk.%d." % i
        w.add_tensor(p + "attn_norm.weight", np.ones(a.width, dtype=np.float32))
        w.add_tensor(p + "attn_q.weight", weight(a.width, a.width))
        w.add_tensor(p + "attn_k.weight", weight(kv, a.width))
        w.add_tensor(p + "attn_v.weight", weight(kv, a.width))
        w.add_tensor(p + "attn_output.weight", weight(a.width, a.width))
        w.add_tensor(p + "ffn_norm.weight", np.ones(a.width, dtype=np.float32))
        w.add_tensor(p + "ffn_gate.weight", weight(a.ffn, a.width))
        w.add_tensor(p + "ffn_up.weight", weight(a.ffn, a.width))
        w.add_tensor(p + "ffn_down.weight", weight(a.width, a.ffn))
    w.add_tensor("output_norm.weight", np.ones(a.width, dtype=np.float32))
    w.add_tensor("output.weight", weight(n_vocab, a.width))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
