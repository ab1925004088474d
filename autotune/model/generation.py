"""What a text-generation trial runs: the workload (prompt length, new tokens, concurrent sequences),
the prompts' token ids, and what a causal language model must offer to be tuned for generation.

Every trial generates the same amount of work: greedy decoding from fixed prompts, exactly
`new_tokens` new tokens per sequence (no early stop at an end-of-sequence token).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

from autotune.common.errors import UserError
from autotune.common.json_record import Record

DEFAULT_PROMPT_TOKENS = 512
DEFAULT_NEW_TOKENS = 64
# What a generation reference holds; a reference of another format is computed again. 3: the prefill's
# last positions and every decode step, each step fed FP32's greedy token (2: prefill logits only).
REFERENCE_FORMAT = 3
# Prompts drift is measured on when --eval-samples does not say (each prompt's last positions and every
# decode step are compared): a few, as every trial evaluates them; more narrow the KL divergence's error.
DEFAULT_DRIFT_PROMPTS = 4
# A study's `sequences` count every instance's together (the user's concurrent streams), split evenly.
SEQUENCES_TOTAL = "total"


@dataclass(frozen=True)
class GenerationWorkload(Record):
    """One generation call: `sequences` prompts of `prompt_tokens` tokens each (the batch), each
    continued by `new_tokens` greedy tokens. `vocab_size` and `context` come from the model.
    `sequences`: what the study's sequences count, "total" (all instances together, each running its
    share: every study created since) or None (stored before: sequences per instance)."""

    OMIT_IF_NONE: ClassVar[tuple[str, ...]] = ("sequences", "tokenizer", "drift_prompts")

    prompt_tokens: int = DEFAULT_PROMPT_TOKENS
    new_tokens: int = DEFAULT_NEW_TOKENS
    vocab_size: int = 0
    context: int | None = None  # the model's longest sequence (max_position_embeddings), when it says
    data: str | None = None  # a text file or a tensor file of token ids: prompts and the evaluation text
    sequences: str | None = None  # SEQUENCES_TOTAL, or None: a study stored when they counted per instance
    # a Hugging Face folder whose tokenizer encodes a text --data (the model's own); None: its UTF-8 bytes
    tokenizer: str | None = None
    # --eval-samples: the prompts drift is measured on; None: DEFAULT_DRIFT_PROMPTS (as every study stored
    # before the number was kept measured, so their records read and write back as they were)
    drift_prompts: int | None = None

    @property
    def prompts_for_drift(self) -> int:
        return self.drift_prompts or DEFAULT_DRIFT_PROMPTS

    def tokens_per_call(self, sequences: int) -> int:
        """Generated tokens per call: what tokens/s counts."""
        return sequences * self.new_tokens


@dataclass(frozen=True)
class LanguageModelInfo:
    vocab_size: int
    context: int | None


def language_model_info(model: Any) -> LanguageModelInfo | None:
    """Vocabulary size and context length of a causal LM (a transformers model, or any module with a
    `config` that has `vocab_size`); None when the model is not one."""
    config = getattr(model, "config", None)
    vocab = getattr(config, "vocab_size", None)
    if not isinstance(vocab, int) or vocab <= 0:
        return None
    is_causal = callable(getattr(model, "generate", None)) or "CausalLM" in type(model).__name__
    if not is_causal:
        return None
    context = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    return LanguageModelInfo(vocab, int(context) if context else None)


def check_workload(workload: GenerationWorkload, info: LanguageModelInfo | None, model_name: str) -> None:
    """Refuse, in one line each, a workload the model cannot run (`info` None: the counts alone)."""
    if workload.new_tokens < 1:
        raise UserError(f"--new-tokens must be 1 or more (got {workload.new_tokens}): a trial times generated tokens")
    if workload.prompt_tokens < 1:
        raise UserError(f"--prompt-tokens must be 1 or more (got {workload.prompt_tokens})")
    total = workload.prompt_tokens + workload.new_tokens
    if info is not None and info.context is not None and total > info.context:
        raise UserError(
            f"prompt of {workload.prompt_tokens} tokens + {workload.new_tokens} new tokens = {total} exceeds the "
            f"{info.context}-token context of {model_name}: lower --prompt-tokens or --new-tokens"
        )


def read_token_data(path: str, vocab_size: int, tokenizer: str | None = None) -> Any:
    """Token ids from `--data`: a tensor file (torch.save of a 1-D or 2-D int tensor), or a text file
    encoded by the model's own tokenizer (`tokenizer`: its Hugging Face folder), or without one as UTF-8
    bytes folded into the vocabulary (a fixed mapping: perplexity is then that of bytes, the same for every
    candidate, which is what drift compares, but not text the model would ever see)."""
    from pathlib import Path

    import torch

    file = Path(path)
    if not file.is_file():
        raise UserError(f"--data {path!r} does not exist")
    if file.suffix in (".pt", ".pth"):
        ids = torch.load(file, weights_only=True)
        if not isinstance(ids, torch.Tensor) or ids.is_floating_point():
            raise UserError(f"--data {path}: expected a tensor of token ids (torch.save of an int tensor)")
        ids = ids.reshape(-1).long()
    elif tokenizer is not None:
        ids = torch.tensor(encode_text(file.read_text(encoding="utf-8", errors="replace"), tokenizer), dtype=torch.long)
    else:
        ids = torch.tensor(list(file.read_bytes()), dtype=torch.long)
    if len(ids) == 0:
        raise UserError(f"--data {path} holds no tokens")
    if int(ids.max()) >= vocab_size or int(ids.min()) < 0:
        if file.suffix in (".pt", ".pth"):
            raise UserError(f"--data {path}: token ids must lie in [0, {vocab_size}) for this model")
        ids = ids % vocab_size
    return ids


def token_rows(path: str, span: int) -> Any:
    """The rows of a 2-D token file whose rows are `span` ids long (the user's own prompts, e.g. the chunks
    llama-perplexity scores), else None: its ids are one stream, and prompts are windows of it."""
    from pathlib import Path

    import torch

    if Path(path).suffix not in (".pt", ".pth"):
        return None
    ids = torch.load(path, weights_only=True)
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[1] != span:
        return None
    return ids.long()


def prompts(workload: GenerationWorkload, sequences: int, seed: int) -> Any:
    """`sequences` prompts of `prompt_tokens` ids: windows of the data's tokens when there is data (a token
    file's rows themselves when they are `prompt_tokens` long: a window across two rows would join texts
    that never met), else ids drawn uniformly with a fixed seed (the same prompts in every trial)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    if workload.data:
        ids = read_token_data(workload.data, workload.vocab_size, workload.tokenizer)
        span = workload.prompt_tokens
        rows = token_rows(workload.data, span)
        if rows is not None:  # each row is a prompt: a seeded order, every row once before any twice
            order = torch.randperm(len(rows), generator=generator)
            return rows[order.repeat(sequences // len(rows) + 1)[:sequences]]
        if len(ids) < span:
            ids = ids.repeat(span // len(ids) + 1)
        starts = torch.randint(0, len(ids) - span + 1, (sequences,), generator=generator)
        return torch.stack([ids[s : s + span] for s in starts.tolist()])
    return torch.randint(0, workload.vocab_size, (sequences, workload.prompt_tokens), generator=generator)


ENCODED_DATA = "data-ids.pt"


def encoded_once(workload: GenerationWorkload, folder: Path) -> GenerationWorkload:
    """The workload with a text --data that the model's tokenizer encodes replaced by those ids, saved once in
    `folder` (the study's reference): every trial, in every runtime, reads the same ids whatever transformers
    that runtime has (the IPEX runtime's 4.x adds SentencePiece's dummy prefix to a text where 5.x does not,
    which would shift every prompt by a token against the reference)."""
    import os
    import tempfile

    import torch

    if not (workload.data and workload.tokenizer) or Path(workload.data).suffix in (".pt", ".pth"):
        return workload
    ids = read_token_data(workload.data, workload.vocab_size, workload.tokenizer)
    folder.mkdir(parents=True, exist_ok=True)
    path = (folder / ENCODED_DATA).resolve()
    with tempfile.NamedTemporaryFile(dir=folder, suffix=".tmp", delete=False) as scratch:
        torch.save(ids, scratch.name)
    os.replace(scratch.name, path)  # whole, also beside another host of a fleet writing the same ids
    return replace(workload, data=str(path), tokenizer=None)


def encode_text(text: str, tokenizer: str) -> list[int]:
    """The text as the model's tokenizer encodes it (its Hugging Face folder), without special tokens: a
    prompt is a window of the text, not a document's start."""
    from autotune.model.hf_folder import load_tokenizer

    return list(load_tokenizer(tokenizer).encode(text, add_special_tokens=False))
