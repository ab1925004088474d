"""The fast tier's end-to-end checks: what a newcomer does first, each in real processes and kept short.

A classification search exported and verified, and a text-generation search with one engine loaded as a
program loads it. The rest of the end-to-end tests (marked slow by their fixtures) run in `make test-all`.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import assert_trials_ran, flagged_noisy, generation_space, rerun_while_noisy


@pytest.mark.smoke
def test_a_classification_search_exports_a_winner_that_verify_remeasures(searcher):
    space = searcher.space(batch_size=[2, 4])
    searched = rerun_while_noisy(lambda: searcher.search("--no-speed-pruning", space=space, trials=2))
    assert searched.returncode == 0, searched.stderr
    assert "wrote" in searched.stdout and "best.json" in searched.stdout
    exported = searcher("export", "--study", "s", "--format", "sh")
    assert exported.returncode == 0, exported.stderr
    assert (searcher.workdir / "studies" / "s" / "launch.sh").is_file()
    best = searcher.best()
    assert best["meets_drift"] and best["config"]["batch_size"] in (2, 4)
    verified = searcher("verify", "studies/s/best.json", "--repeats", "1")
    assert verified.returncode in (0, 1, 3), verified.stdout + verified.stderr  # 3: every run disturbed here
    assert "same hardware and software as when it was tuned" in verified.stdout
    assert flagged_noisy(verified) or "samples/s here" in verified.stdout, verified.stdout


@pytest.mark.smoke
def test_a_generation_search_with_one_engine_gives_a_winner_a_program_loads(searcher):
    space = generation_space(searcher.workdir / "space.yaml", {"eager": {"precision": ["fp32", "bf16"]}}, (1,))
    searched = searcher.generate(space=space, trials=2)
    assert_trials_ran(searched)
    assert "task: generate, prompt 32 tokens, 8 new tokens" in searched.stdout
    study = searcher.study("tiny_llama")
    assert {t.user_attrs["config"]["precision"] for t in study.trials} == {"fp32", "bf16"}
    timed = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert timed and all(t.user_attrs["generation"]["tokens_per_s"] > 0 for t in timed)
    best_path = searcher.workdir / "studies" / "tiny_llama" / "best.json"
    if not best_path.exists():  # every measurement disturbed by other load: nothing won
        assert "was flagged as noisy" in searched.stderr
        return
    import autotune

    generate = autotune.load(best_path, check_environment=False)
    tokens = generate(torch.randint(0, 256, (1, 32), generator=torch.Generator().manual_seed(0)))
    assert tokens.shape == (1, 8) and tokens.dtype == torch.long
    assert json.loads(best_path.read_text())["metrics"]["generation"]["new_tokens"] == 8
