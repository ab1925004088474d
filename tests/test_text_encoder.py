"""A transformer text encoder end to end: two integer inputs (token ids, attention mask), every backend that
exports the model (torchao transforms the eager module in place and reads its inputs as eager does: its
int8 path is in tests/test_backends.py and tests/test_precision.py)."""

import json

import torch
from conftest import load_study, tiny, write_space

INPUTS = "input_ids:int64:32:0-1000,attention_mask:int64:32:1-2"
BACKENDS = {
    "eager": {"precision": ["fp32"], "memory_format": ["contiguous"]},  # eager bf16: tests/test_backends.py
    "onnxruntime": {
        "precision": ["fp32", "int8"],
        "execution_mode": ["sequential"],
        "graph_optimization": ["all"],
        "inter_op_threads": [1],
    },
    "openvino": {"precision": ["fp32", "int8"], "hint": ["LATENCY"], "streams": [1], "int8_float": ["f32"]},
}


def test_a_text_encoder_completes_a_study_on_token_data(searcher, workdir):
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 1000, (40, 32), generator=generator)
    mask = (torch.arange(32) < torch.randint(8, 33, (40, 1), generator=generator)).long()  # real padding
    torch.save({"inputs": {"input_ids": ids, "attention_mask": mask}}, workdir / "tokens.pt")
    space = write_space(workdir / "space.yaml", batch_size=[4], backends=BACKENDS, baseline={"batch_size": 4})
    result = searcher.search(
        "--inputs",
        INPUTS,
        "--data",
        str(workdir / "tokens.pt"),
        "--eval-samples",
        "16",
        "--calibration-samples",
        "16",
        "--drift-metric",
        "cosine",
        "--max-drift",
        "0.05",
        "--no-speed-pruning",
        "--measure-seconds",
        "0.3s-2s",
        "--finalists",
        "0",
        model=tiny("sentence_encoder"),
        study="bert",
        space=space,
        trials=5,
        budget="12m",
        input_shape=None,
        quick=False,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr
    assert f"input {INPUTS}" in result.stdout and "data: tensor file" in result.stdout
    study = load_study(workdir, "bert")
    by_config = {(t.user_attrs["config"]["backend"], t.user_attrs["config"]["precision"]): t for t in study.trials}
    assert len(by_config) == 5
    failed = {k: t.user_attrs.get("fail_cause") for k, t in by_config.items() if t.state.name == "FAIL"}
    assert not failed, failed
    for key in (("eager", "fp32"), ("onnxruntime", "fp32"), ("openvino", "fp32")):
        trial = by_config[key]
        assert trial.state.name == "COMPLETE" and trial.user_attrs["drift"]["cosine_similarity"] > 0.999, key
    quantized = [t for k, t in by_config.items() if k[1] == "int8"]
    assert all(t.user_attrs["drift"]["samples"] == 16 for t in quantized)
    assert any(t.state.name == "COMPLETE" for t in quantized)
    best = json.loads((workdir / "studies" / "bert" / "best.json").read_text())
    assert best["model"]["inputs"][0]["name"] == "input_ids" and best["drift"]["metric"] == "cosine"
