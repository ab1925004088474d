"""Tiny causal language models for generation tests: a Llama-architecture decoder built from a
transformers config (random init), and one trained for under a minute on the docstrings of Python's
standard library (text that ships with Python), so that perplexity means something.

Text is encoded as UTF-8 bytes (vocabulary 256), the same tokenizer-free mapping autotune applies to a
text file passed as --data.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, OPTConfig, OPTForCausalLM

TEXT_MODULES = ("json", "pathlib", "argparse", "collections", "functools", "itertools", "textwrap", "string")


def llama_config(context: int = 256, vocab: int = 256) -> LlamaConfig:
    return LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=vocab,
        max_position_embeddings=context,
        tie_word_embeddings=False,
    )


def tiny_llama() -> LlamaForCausalLM:
    """Random init (autotune seeds it and saves the init every trial loads)."""
    return LlamaForCausalLM(llama_config())


def tiny_llama_tied() -> LlamaForCausalLM:
    """The tiny Llama with its output layer tied to the token embedding (as Llama 3.2 1B, Qwen2.5 and SmolLM
    ship): a GGUF of it holds no output matrix of its own."""
    config = llama_config()
    config.tie_word_embeddings = True
    return LlamaForCausalLM(config)


def tiny_gpt2() -> GPT2LMHeadModel:
    """A GPT-2-style decoder (random init): its attention and MLP projections are transformers' Conv1D
    modules, not nn.Linear."""
    config = GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=256, vocab_size=256, tie_word_embeddings=False)
    return GPT2LMHeadModel(config)


def tiny_opt() -> OPTForCausalLM:
    """An architecture llama.cpp's converter does not know (OPT)."""
    config = OPTConfig(
        hidden_size=64,
        ffn_dim=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        vocab_size=256,
        max_position_embeddings=256,
        word_embed_proj_dim=64,
    )
    return OPTForCausalLM(config)


def outlier_llama() -> LlamaForCausalLM:
    """The trained model (weights from $AUTOTUNE_TEST_LM_WEIGHTS) with the activation outliers large
    language models are known for: one hidden channel of every MLP scaled up 1000x going in and down
    1000x going out. FP32 computes the same function; quantizing activations per token (DA8W8) loses
    every other channel to that one's range, while weight-only int8 keeps it (per output channel)."""
    model = LlamaForCausalLM(llama_config())
    model.load_state_dict(torch.load(os.environ["AUTOTUNE_TEST_LM_WEIGHTS"], weights_only=True))
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.up_proj.weight[0] *= 1000.0
            layer.mlp.down_proj.weight[:, 0] /= 1000.0
    return model


def stdlib_text(modules: tuple[str, ...] = TEXT_MODULES, methods: bool = False) -> str:
    """Docstrings of standard-library modules and their public members (with `methods`, also the methods of
    the classes each defines: about 1.1 MB over every module of `all_stdlib_modules()`)."""
    import importlib
    import warnings

    parts = []
    for name in modules:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                module = importlib.import_module(name)
            except Exception:  # a module this build of Python lacks (e.g. no tkinter)
                continue
        members = [module] if methods else []
        for _, member in inspect.getmembers(module):
            members.append(member)
            if methods and inspect.isclass(member) and getattr(member, "__module__", None) == name:
                members.extend(method for _, method in inspect.getmembers(member))
        for member in members:
            doc = inspect.getdoc(member)
            if doc and len(doc) > 40:
                parts.append(doc)
    return "\n\n".join(dict.fromkeys(parts))


def all_stdlib_modules() -> tuple[str, ...]:
    """The standard library's public top-level modules, less those that open windows or print on import."""
    import sys

    noisy = {"antigravity", "this", "idlelib", "turtledemo", "tkinter", "turtle"}
    return tuple(sorted(n for n in sys.stdlib_module_names if not n.startswith("_") and n not in noisy))


def fit(
    model: LlamaForCausalLM,
    train: torch.Tensor,
    held_out: torch.Tensor,
    steps: int,
    seq: int,
    batch: int,
    seconds: float | None = None,
    bf16: bool = False,
) -> tuple[int, float]:
    """Train on random windows of `train` (AdamW, seeded) for `steps`, or until `seconds` pass; returns the
    steps taken and the perplexity on the first 32 windows of `held_out`, the model left in eval mode.
    `bf16`: forward and backward under bfloat16 autocast (the weights stay FP32), faster where the CPU has it."""
    import time

    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    deadline = time.monotonic() + seconds if seconds else None
    done = 0
    for done in range(1, steps + 1):  # noqa: B007 (read after the loop)
        starts = torch.randint(0, len(train) - seq - 1, (batch,), generator=generator)
        ids = torch.stack([train[s : s + seq] for s in starts.tolist()])
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if deadline and time.monotonic() > deadline:
            break
    model.eval()
    with torch.no_grad():
        ids = held_out[: (len(held_out) // seq) * seq].reshape(-1, seq)[:32]
        perplexity = float(torch.exp(model(input_ids=ids, labels=ids).loss))
    return done, perplexity


def train_llama(workdir: Path, steps: int = 150, seq: int = 64, batch: int = 8) -> dict[str, Path | float]:
    """Train the tiny Llama on 90% of the text; write its weights and the held-out 10% as a text file.
    Returns the paths and the held-out perplexity (per byte)."""
    torch.manual_seed(0)
    data = torch.tensor(list(stdlib_text().encode()), dtype=torch.long)
    split = int(len(data) * 0.9)
    train, held_out = data[:split], data[split:]
    model = LlamaForCausalLM(llama_config())
    _, perplexity = fit(model, train, held_out, steps, seq, batch)
    weights, text = workdir / "lm.pt", workdir / "held_out.txt"
    torch.save(model.state_dict(), weights)
    text.write_bytes(bytes(held_out.tolist()))
    return {"weights": weights, "text": text, "perplexity": perplexity}


def bpe_tokenizer(text: str, vocab: int = 256) -> Any:
    """A BPE tokenizer of at most `vocab` tokens trained on `text` (seconds): what a model folder ships
    beside its weights, so prompts are its ids, not bytes."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<unk>", "<s>", "</s>"])
    tokenizer.train_from_iterator([text], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def sentencepiece_folder(folder: Path, text: str, vocab: int = 512) -> Any:
    """A SentencePiece tokenizer of `vocab` pieces trained on `text` (seconds) written into a model folder
    as Llama folders hold one (tokenizer.model and its config), which llama.cpp's converter reads; returns
    it as transformers loads it. Its 256 byte pieces encode any character, as Llama's do (llama.cpp aborts
    on a character a tokenizer without them cannot encode)."""
    import json
    import shutil
    import tempfile

    import sentencepiece
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as scratch:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(text.splitlines()),
            model_prefix=f"{scratch}/spm",
            vocab_size=vocab,
            model_type="bpe",  # as Llama's (transformers reads a SentencePiece model as BPE)
            character_coverage=1.0,
            unk_id=0,
            bos_id=1,
            eos_id=2,
            pad_id=-1,
            hard_vocab_limit=False,
            byte_fallback=True,
            # Llama's conventions: text kept as it is (newlines and runs of spaces included), digits apart
            normalization_rule_name="identity",
            remove_extra_whitespaces=False,
            split_digits=True,
            allow_whitespace_only_pieces=True,
            minloglevel=2,
        )
        shutil.copyfile(f"{scratch}/spm.model", folder / "tokenizer.model")
    config = {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return AutoTokenizer.from_pretrained(str(folder))


def train_llama_folder(
    folder: Path,
    steps: int = 300,
    seq: int = 128,
    batch: int = 8,
    config: LlamaConfig | None = None,
    vocab: int = 512,
    seconds: float | None = None,
    text: str | None = None,
    bf16: bool = False,
) -> dict[str, Any]:
    """A Llama trained on the standard library's docstrings as its users hold one: a Hugging Face folder with
    a SentencePiece tokenizer trained on the same text (512 pieces), the model trained on 90% of that text's
    ids; the held-out 10% written as text beside it. Returns the folder, the tokenizer, the held-out text
    and its ids, and the held-out perplexity (per token). `seconds`: stop training then, if sooner. `text`:
    another text to train on (its last 10% held out)."""
    text = text or stdlib_text()
    split = int(len(text) * 0.9)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = sentencepiece_folder(folder, text[:split], vocab)
    config = config or llama_config(context=512, vocab=len(tokenizer))
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    train = torch.tensor(tokenizer.encode(text[:split], add_special_tokens=False), dtype=torch.long)
    held_out_text = text[split:]
    held_out = torch.tensor(tokenizer.encode(held_out_text, add_special_tokens=False), dtype=torch.long)
    done, perplexity = fit(model, train, held_out, steps, seq, batch, seconds, bf16)
    model.save_pretrained(folder)
    text_file = folder.parent / f"{folder.name}-held-out.txt"
    text_file.write_text(held_out_text)
    return {
        "folder": folder,
        "tokenizer": tokenizer,
        "text": text_file,
        "ids": held_out,
        "perplexity": perplexity,
        "steps": done,
        "parameters": sum(p.numel() for p in model.parameters()),
    }
