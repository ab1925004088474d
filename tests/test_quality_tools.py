"""autotune's KL divergence beside llama.cpp's own, `llama-perplexity --kl-divergence`, on the same GGUFs and
the same text: the independent check of the quality measure, as llama-batched-bench is of the speed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import tiny_lm
import torch
from conftest import QUICK_GENERATION, assert_trials_ran, generation_space, load_study

from autotune.backends.llamacpp import gguf_export
from autotune.backends.llamacpp.own_tool import PERPLEXITY_TOOL, perplexity_kld, tool_path
from autotune.model.sources import build_model, resolve_model
from autotune.records.attributes import TrialAttrs
from autotune.results.selection import metrics_of

CONTEXT = 256  # llama-perplexity's chunk: its second half is scored; autotune compares a prompt's last 128


@pytest.mark.slow
def test_autotunes_kl_divergence_agrees_with_llama_perplexity_on_the_same_ggufs(searcher, workdir):
    """On a trained tiny Llama folder, autotune's trials of Q8_0 and Q4_0 record a KL divergence from FP32 within
    10% of what llama-perplexity reports for the same GGUF against the F32 GGUF, over the same positions: one
    chunk of the held-out text, BOS first (llama-perplexity's chunk) and the prompt autotune is given. Q8_0
    loses less than Q4_0 by both."""
    trained = tiny_lm.train_llama_folder(workdir / "trained", steps=300)
    folder, tokenizer = trained["folder"], trained["tokenizer"]
    text = trained["text"]
    ids = tokenizer.encode(text.read_text(), add_special_tokens=False)
    assert torch.equal(torch.tensor(ids), trained["ids"])
    prompt = torch.tensor([[tokenizer.bos_token_id, *ids[: CONTEXT - 1]]])  # llama-perplexity's first chunk
    torch.save(prompt, workdir / "chunk.pt")

    kld = {}
    for gguf_type in ("Q8_0", "Q4_0"):
        space = generation_space(
            workdir / f"{gguf_type}.yaml",
            {"eager": {"precision": ["fp32"], "kv_cache": ["dynamic"]}, "llamacpp": {"precision": [gguf_type]}},
            sequences=(1,),
        )
        study = f"kld-{gguf_type}"
        words = ["--model", str(folder), "--space", str(space), "--data", str(workdir / "chunk.pt")]
        shape = ["--prompt-tokens", str(CONTEXT), "--new-tokens", "1", "--eval-samples", "1", "--finalists", "0"]
        result = searcher(
            "search", *words, *shape, *QUICK_GENERATION, "--max-drift", "100", "--study", study, "--trials", "2"
        )
        assert_trials_ran(result)
        trial = next(
            t
            for t in load_study(workdir, study).trials
            if t.state.name == "COMPLETE" and TrialAttrs.of(t).config.backend == "llamacpp"
        )
        metrics = metrics_of(trial)
        repacked = str((metrics.backend_details or {}).get("extra_weight_buffers", "on")).startswith("on")
        kld[gguf_type] = (metrics.drift.kl_divergence, Path(metrics.artifact.dir) / "model.gguf", repacked)

    base = workdir / "f32.gguf"
    gguf_export.convert(
        build_model(resolve_model(str(folder), None, f"input_ids:int64:16:0-{len(tokenizer)}")), "F32", base
    )
    tool = tool_path(sys.prefix, PERPLEXITY_TOOL)
    assert tool.is_file(), f"{tool} is missing: make llama-tools builds it"
    theirs = {  # loaded as the trial loaded it: with llama.cpp's extra weight buffers or without
        gguf_type: perplexity_kld(tool, base, gguf, text, CONTEXT, 1, 2, workdir, repack)["mean_kld"]
        for gguf_type, (_, gguf, repack) in kld.items()
    }
    ours = {gguf_type: value for gguf_type, (value, _, _) in kld.items()}
    assert ours["Q8_0"] < ours["Q4_0"] and theirs["Q8_0"] < theirs["Q4_0"], (ours, theirs)
    for gguf_type in ours:
        assert ours[gguf_type] == pytest.approx(theirs[gguf_type], rel=0.10), (gguf_type, ours, theirs)
