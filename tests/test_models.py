"""Model resolution: torchvision names, weights files, the torch hub cache; and one inductor study."""

import os

import pytest
import torch
import torchvision
from conftest import TINY, assert_trials_ran, load_study, states, write_space

from autotune.common.errors import UserError
from autotune.model.sources import HUB_CACHE, RANDOM_INIT, WEIGHTS_FILE, build_model, resolve_model


def test_random_init_is_the_default_and_reproducible():
    source = resolve_model("resnet18", None, "3x32x32")
    assert source.weights_origin == RANDOM_INIT and source.input_shape == (3, 32, 32)
    a, b = build_model(source), build_model(source)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_default_input_shape_comes_from_the_model():
    assert resolve_model("resnet18", None, None).input_shape == (3, 224, 224)
    assert resolve_model("inception_v3", None, None).input_shape == (3, 299, 299)


def test_weights_file_is_loaded(tmp_path):
    torch.manual_seed(7)
    trained = torchvision.models.get_model("resnet18", weights=None)
    torch.save(trained.state_dict(), tmp_path / "w.pt")
    source = resolve_model("resnet18", str(tmp_path / "w.pt"), "3x32x32")
    assert source.weights_origin == WEIGHTS_FILE
    loaded = build_model(source)
    assert torch.equal(loaded.conv1.weight, trained.conv1.weight)


def test_weights_in_the_torch_hub_cache_are_used(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    url = torchvision.models.get_model_weights("resnet18").DEFAULT.url
    checkpoints = tmp_path / "hub" / "checkpoints"
    checkpoints.mkdir(parents=True)
    torch.save(torchvision.models.get_model("resnet18", weights=None).state_dict(), checkpoints / os.path.basename(url))
    source = resolve_model("resnet18", None, None)
    assert source.weights_origin == HUB_CACHE and source.weights_path.startswith(str(checkpoints))


def test_factory_model_needs_an_input_shape():
    with pytest.raises(UserError, match="--input-shape"):
        resolve_model(f"{TINY}:tiny_cnn", None, None)
    assert resolve_model(f"{TINY}:tiny_cnn", None, "3x8x8").kind == "factory"


def _saved_models(tmp_path):
    """The same tiny CNN as TorchScript and as an exported program with a dynamic batch."""
    import sys

    sys.path.insert(0, str(TINY.parent))
    from tiny_models import TinyCNN

    model, example = TinyCNN().eval(), torch.randn(2, 3, 16, 16)
    torch.jit.save(torch.jit.script(model), tmp_path / "tiny.pt")
    batch = torch.export.Dim("batch", min=1, max=1024)
    torch.export.save(torch.export.export(model, (example,), dynamic_shapes={"x": {0: batch}}), tmp_path / "tiny.pt2")
    torch.export.save(torch.export.export(model, (example,)), tmp_path / "fixed.pt2")
    return model


def test_model_files_load_with_their_own_weights(tmp_path):
    model = _saved_models(tmp_path)
    x = torch.randn(5, 3, 16, 16)
    with pytest.raises(UserError, match="pass --allow-pickle if you trust the file"):
        resolve_model(str(tmp_path / "tiny.pt2"), None, None)  # nothing unpickled without consent
    exported = resolve_model(str(tmp_path / "tiny.pt2"), None, None, allow_pickle=True)
    assert exported.kind == "exported-program" and exported.input_shape == (3, 16, 16)  # read from the program
    assert exported.has_own_weights and exported.weights_sha256
    scripted = resolve_model(str(tmp_path / "tiny.pt"), None, "3x16x16")
    for source in (exported, scripted):
        assert torch.allclose(build_model(source)(x), model(x), atol=1e-5)
    with pytest.raises(UserError, match="fixed batch of 2"):
        resolve_model(str(tmp_path / "fixed.pt2"), None, None, allow_pickle=True)
    with pytest.raises(UserError, match="give --input-shape"):
        resolve_model(str(tmp_path / "tiny.pt"), None, None)


@pytest.mark.parametrize("file", ["tiny.pt", "tiny.pt2"])
def test_a_model_file_completes_a_short_study(searcher, workdir, file):
    _saved_models(workdir)
    space = write_space(
        workdir / "space.yaml",
        backends={
            "eager": {"precision": ["fp32", "bf16"], "memory_format": ["contiguous"]},
            "openvino": {"precision": ["fp32"], "hint": ["LATENCY"], "streams": [1]},
        },
    )
    trust = ["--allow-pickle"] if file.endswith(".pt2") else []
    result = searcher.search(
        *trust, "--no-speed-pruning", model=str(workdir / file), space=space, trials=3, study=None, timeout=400
    )
    assert_trials_ran(result)
    assert "weights inside the model file" in result.stdout
    study = load_study(workdir, "tiny")
    assert states(study) == ["COMPLETE"] * 3, [t.user_attrs.get("fail_cause") for t in study.trials]
    assert study.trials[0].user_attrs["drift"]["relative_l2"] == 0.0
    (openvino,) = [t for t in study.trials if t.user_attrs["config"]["backend"] == "openvino"]
    assert openvino.user_attrs["drift"]["relative_l2"] < 1e-3


def test_a_factory_may_return_example_inputs():
    source = resolve_model(f"{TINY}:sentence_encoder_with_example", None, None)
    ids, mask = source.specs
    assert (ids.name, ids.shape, ids.dtype, mask.name, mask.high) == ("input_ids", (32,), "int64", "attention_mask", 2)
    assert ids.high <= 1000 and source.input_shape == (32,)
    model = build_model(source)
    assert isinstance(model, torch.nn.Module) and model(
        torch.zeros(3, 32, dtype=torch.long), torch.ones(3, 32, dtype=torch.long)
    ).shape == (3, 64)
