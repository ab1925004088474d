"""The decoders the text-generation benchmarks measure (random init, Llama architecture): the ~100M one
(hidden 768; its depth from $BENCH_LAYERS, default 8) and the ~1B one. A search names them as
`--model docs/benchmarks/decoders.py:decoder` (or `:decoder_1b`)."""

from __future__ import annotations

import os


def decoder():
    """A Llama-architecture decoder of about 100M parameters (layers from $BENCH_LAYERS, default 8)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=int(os.environ.get("BENCH_LAYERS", "8")),
        num_attention_heads=12,
        num_key_value_heads=12,
        vocab_size=32000,
        max_position_embeddings=2048,
    )
    return LlamaForCausalLM(config)


def decoder_1b():
    """A Llama-architecture decoder of about 1B parameters (hidden 2048, 16 layers, 32 heads, MLP 5632,
    vocabulary 32000: 0.82B in the blocks, 0.13B in the embedding and output layers), random init."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=32,
        vocab_size=32000,
        max_position_embeddings=2048,
    )
    return LlamaForCausalLM(config)
