"""OpenVINO GenAI's benchmark as the tool rows run it (docs/benchmarks/genai_benchmark.py): at the CPU plugin's
default activations unless told, saying which it ran; and autotune's row of the same type runs those
activations too, so the quality beside the tool's speed is that of the numbers it computed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from conftest import benchmark_script

from autotune.records.config import TrialConfig

BENCHMARKS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks"


def test_genais_benchmark_runs_the_plugins_default_activations_or_the_named_ones_and_says_which(tmp_path):
    import openvino as ov
    import tiny_lm

    from autotune.backends import backend_module

    torch.manual_seed(0)
    config = TrialConfig("openvino", "fp32", batch_size=1, threads_per_instance=2)
    backend_module("openvino", "generate").build_artifact(tiny_lm.tiny_llama().eval(), None, config, tmp_path)
    default = ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT").to_string()
    assert default in ("f32", "bf16", "f16"), default  # the hint's name, as the plugin takes it back
    engines = benchmark_script("llm_engines")
    options = engines.openvino_row_options()
    assert options["inference_precision"] == default  # autotune's row: the tool's numerics
    from autotune.backends.openvino.generate import OpenVinoGenerator
    from autotune.backends.openvino.ir_export import IR_FILE

    row = OpenVinoGenerator(tmp_path / IR_FILE, new_tokens=4, threads=2, inference_precision=default)
    assert row.generate(torch.zeros(1, 16, dtype=torch.long), stamp=False).shape == (1, 4)  # the plugin takes it
    for named in (None, "f32"):
        command = [sys.executable, str(BENCHMARKS / "genai_benchmark.py"), str(tmp_path), "--prompt", "16"]
        command += ["--new", "4", "--iterations", "1", "--threads", "2"]  # ids below the IR's own vocabulary
        command += ["--inference-precision", named] if named else []  # the default: the plugin's own
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True)
        printed = json.loads(done.stdout.strip().splitlines()[-1])
        assert printed["inference_precision"] == (named or default)
        assert printed["generated_per_call"] == 4
        assert printed["vocab"] == tiny_lm.tiny_llama().config.vocab_size  # read from the IR's config.json
