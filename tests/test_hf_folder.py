"""A Hugging Face model folder as `--model`: the task from its config's architectures, the weights from
safetensors (or pytorch_model.bin, weights only) with their digest, the same model built in the worker
as was saved, and a bad folder refused in one line before anything is created."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import tiny_lm
import torch
from conftest import GENERATE, QUICK_GENERATION, assert_trials_ran, generation_space, load_study

from autotune.model.hf_folder import read_folder
from autotune.model.sources import ModelSource, build_model, resolve_model
from autotune.records.spec import StoredSpec


def llama_folder(path: Path, safe: bool = True) -> tuple[Path, torch.nn.Module]:
    """A tiny Llama saved as a folder; `safe=False`: its weights as pytorch_model.bin, as older folders hold
    them (transformers 5 writes safetensors only)."""
    torch.manual_seed(0)
    model = tiny_lm.tiny_llama().eval()
    model.save_pretrained(path)
    if not safe:
        (path / "model.safetensors").unlink()
        torch.save(model.state_dict(), path / "pytorch_model.bin")
    return path, model


def vit_folder(path: Path) -> tuple[Path, torch.nn.Module]:
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    config = ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=5,
    )
    model = ViTForImageClassification(config).eval()
    model.save_pretrained(path)
    return path, model


def test_a_language_model_folder_generates_from_its_own_weights_and_builds_what_was_saved(tmp_path):
    folder, model = llama_folder(tmp_path / "llama")
    source = resolve_model(str(folder), None, "input_ids:int64:16:0-256")
    assert (source.kind, source.task, source.weights_origin) == ("hf-folder", "generate", "hf-folder")
    assert source.has_own_weights and source.weights_path is None  # no random init is saved for the trials
    assert source.weights_sha256 == read_folder(str(folder)).digest()
    assert ModelSource.from_json(source.to_json()) == source
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(build_model(source)(ids).logits, model(ids).logits)
    # pytorch_model.bin, read weights-only: the same model, and its digest says the files differ
    pickled, _ = llama_folder(tmp_path / "bin", safe=False)
    other = resolve_model(str(pickled), None, "input_ids:int64:16:0-256")
    assert other.weights_sha256 != source.weights_sha256
    with torch.no_grad():
        torch.testing.assert_close(build_model(other)(ids).logits, model(ids).logits)
    # another model in the same folder is another digest
    torch.manual_seed(1)
    tiny_lm.tiny_llama().save_pretrained(folder)
    assert resolve_model(str(folder), None, "input_ids:int64:16:0-256").weights_sha256 != source.weights_sha256


def test_a_causal_language_model_not_named_for_causal_lm_is_one(tmp_path):
    """GPT-2's architecture is GPT2LMHeadModel: transformers' causal-LM table says what its name does not."""
    tiny_lm.tiny_gpt2().save_pretrained(tmp_path / "gpt2")
    assert read_folder(str(tmp_path / "gpt2")).task == "generate"


def test_other_models_records_are_written_as_before(tmp_path):
    """A folder's task and trust are written for a folder only: a stored factory model reads and compares as
    it did."""
    factory = resolve_model(f"{tiny_lm.__file__}:tiny_llama", None, "input_ids:int64:16:0-256")
    assert "task" not in factory.to_json() and "trust_remote_code" not in factory.to_json()


def test_an_image_classifier_folder_classifies_at_its_own_image_size(tmp_path):
    folder, model = vit_folder(tmp_path / "vit")
    source = resolve_model(str(folder), None, None)
    assert (source.task, tuple(source.input_shape)) == ("classify", (3, 32, 32))
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        out = build_model(source)(images)
        assert isinstance(out, torch.Tensor)  # the logits alone, as the exporters and compilers expect
        torch.testing.assert_close(out, model(images).logits)


def test_weights_may_be_a_safetensors_file(tmp_path):
    from safetensors.torch import save_file

    torch.manual_seed(3)
    model = tiny_lm.tiny_llama()
    weights = tmp_path / "weights.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(weights))
    source = resolve_model(f"{tiny_lm.__file__}:tiny_llama", str(weights), "input_ids:int64:16:0-256")
    ids = torch.randint(0, 256, (1, 16))
    with torch.no_grad():
        torch.testing.assert_close(build_model(source)(ids).logits, model.eval()(ids).logits)


def _bad_folders(root: Path) -> dict[str, tuple[Path, list[str], str]]:
    """Each bad case: the folder, extra words, and what its one line says."""
    from transformers import BertConfig, BertModel

    empty = root / "empty"
    empty.mkdir()
    no_weights = root / "no-weights"
    no_weights.mkdir()
    config_only = tiny_lm.llama_config()
    config_only.architectures = ["LlamaForCausalLM"]
    config_only.save_pretrained(no_weights)
    bert = root / "bert"
    BertModel(
        BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    ).save_pretrained(bert)
    remote, _ = llama_folder(root / "remote")
    config = json.loads((remote / "config.json").read_text())
    (remote / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoModelForCausalLM": "x.Model"}}))
    unknown, _ = llama_folder(root / "unknown")
    (unknown / "config.json").write_text(json.dumps({**config, "architectures": ["FancyNewForCausalLM"]}))
    llama, _ = llama_folder(root / "llama")
    broken, _ = llama_folder(root / "broken-tokenizer")
    (broken / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    (broken / "tokenizer.json").write_text("{not json")
    return {
        "a tokenizer that fails to load": (broken, [], "its tokenizer cannot be loaded"),
        "empty": (empty, [], "has no config.json"),
        "no weights": (no_weights, [], "has no weights"),
        "an encoder": (bert, [], "holds a BertModel; autotune tunes a causal language model"),
        "shipped code": (remote, [], "pass --trust-remote-code if you trust it"),
        "unknown architecture": (unknown, [], "which transformers"),
        "task mismatch": (llama, ["--task", "classify"], "times on generate; drop --task"),
    }


def test_bad_folders_are_refused_in_one_line_with_nothing_created(cli, workdir, tmp_path):
    for case, (folder, extra, message) in _bad_folders(tmp_path).items():
        result = cli("search", "--model", str(folder), "--budget", "1m", *extra, timeout=120)
        assert result.returncode == 2, (case, result.stderr)
        assert message in result.stderr and "Traceback" not in result.stderr, (case, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, (case, result.stderr)
        assert not (workdir / "studies").exists(), case


def test_a_folder_is_searched_end_to_end_on_its_own_weights_and_its_tokenizers_ids(searcher, workdir):
    """`autotune search --model FOLDER --data TEXT`: a generation study of the folder's own weights (no random
    init saved), its first line saying so, its prompts and drift text its tokenizer's ids, its trials
    generating."""
    folder, tokenizer, text = tokenized_llama_folder(workdir / "my-llama")
    data = workdir / "text.txt"
    data.write_text(text[:20000])
    space = generation_space(
        workdir / "space.yaml", {"eager": {"precision": ["fp32", "bf16"], "kv_cache": ["dynamic"]}}
    )
    words = ["--model", str(folder), "--space", str(space), "--data", str(data), *QUICK_GENERATION, *GENERATE]
    result = searcher("search", *words, "--trials", "2")
    assert_trials_ran(result)
    assert "as the model's tokenizer's ids" in result.stdout, result.stdout
    assert "KLD " in result.stdout  # every trial's KL divergence from FP32, whatever bounds it
    reference = torch.load(workdir / "studies" / "my-llama" / "reference" / "reference.pt", weights_only=True)
    joined = " ".join(map(str, tokenizer.encode(text[:20000], add_special_tokens=False)))
    assert all(" ".join(map(str, row.tolist())) in joined for row in reference["prompts"])
    assert "a Hugging Face folder (generate), its weights (sha256" in result.stdout, result.stdout
    assert "RANDOM INIT" not in result.stdout
    study = load_study(workdir, "my-llama")
    completed = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert completed and all(t.user_attrs["job"]["model"]["kind"] == "hf-folder" for t in completed)
    assert all(t.user_attrs["drift"]["kl_divergence"] >= 0 for t in completed)
    # without --drift-metric, a language model is bounded as llama.cpp's tables rank quantizations
    criterion = StoredSpec.of(study).criterion
    assert (criterion.metric, criterion.max_drop, criterion.relative) == ("kld", 0.05, False)
    assert not (workdir / "studies" / "my-llama" / "reference" / "weights.pt").exists()
    # other weights in the folder are another model: the study is not resumed on them
    torch.manual_seed(1)
    tiny_lm.tiny_llama().save_pretrained(folder)
    again = searcher("search", *words, "--trials", "1")
    assert again.returncode == 2 and "model (weights_sha256)" in again.stderr, again.stderr


@pytest.mark.parametrize("name", ["weights.safetensors"])
def test_a_broken_safetensors_file_is_refused_in_one_line(cli, workdir, name):
    (workdir / name).write_bytes(b"not a safetensors file")
    result = cli("search", "--model", "resnet18", "--weights", name, timeout=120)
    assert result.returncode == 2 and "is not a safetensors file" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_the_ipex_runtime_builds_a_folder_written_by_transformers_5_with_its_rope_base(ipex_runtime, tmp_path):
    """transformers 5 writes the rotary base into `rope_parameters`, which the IPEX runtime's transformers 4.x
    does not read: at a base other than its default (a Llama 3's 500000) it would compute another model.
    The IPEX runtime's build computes the logits the main runtime's does."""
    import subprocess

    from transformers import LlamaForCausalLM

    config = tiny_lm.llama_config()
    config.rope_parameters = {"rope_type": "default", "rope_theta": 500000.0}
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(tmp_path / "llama3ish")
    assert "rope_theta" not in json.loads((tmp_path / "llama3ish" / "config.json").read_text())
    ids = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(2))
    torch.save(ids, tmp_path / "ids.pt")
    script = (
        "import sys, torch\n"
        "from autotune.model.hf_folder import build\n"
        "model = build(sys.argv[1], 'generate')\n"
        "with torch.no_grad(): torch.save(model(torch.load(sys.argv[2])).logits, sys.argv[3])\n"
    )
    done = subprocess.run(
        [
            ipex_runtime.python,
            "-c",
            script,
            str(tmp_path / "llama3ish"),
            str(tmp_path / "ids.pt"),
            str(tmp_path / "out.pt"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    with torch.no_grad():
        torch.testing.assert_close(torch.load(tmp_path / "out.pt"), model(ids).logits, rtol=1e-4, atol=1e-4)


def tokenized_llama_folder(path: Path) -> tuple[Path, Any, str]:
    """The tiny Llama with a BPE tokenizer trained on the standard library's docstrings, and that text."""
    folder, _ = llama_folder(path)
    text = tiny_lm.stdlib_text()
    tokenizer = tiny_lm.bpe_tokenizer(text)
    tokenizer.save_pretrained(folder)
    return folder, tokenizer, text


def test_a_folders_tokenizer_encodes_the_text_data_and_is_part_of_what_the_model_is(tmp_path):
    from autotune.model.generation import GenerationWorkload, prompts, read_token_data

    folder, tokenizer, text = tokenized_llama_folder(tmp_path / "llama")
    data = tmp_path / "text.txt"
    data.write_text(text[:20000])
    ids = read_token_data(str(data), 256, str(folder))
    expected = tokenizer.encode(text[:20000], add_special_tokens=False)
    assert ids.tolist() == expected and len(expected) < len(text[:20000].encode())  # words, not bytes
    assert ids.tolist() != read_token_data(str(data), 256).tolist()  # the bytes a folder without one reads
    workload = GenerationWorkload(16, 4, 256, 256, str(data), "total", str(folder))
    windows = prompts(workload, 3, 0)
    joined = " ".join(map(str, expected))
    assert all(" ".join(map(str, row.tolist())) in joined for row in windows)  # windows of the tokenized text
    assert GenerationWorkload.from_json(workload.to_json()) == workload
    assert "tokenizer" not in GenerationWorkload(16, 4, 256).to_json()  # other studies' records as before
    # the tokenizer decides the prompts' ids: another one is another model
    before = read_folder(str(folder)).digest()
    tiny_lm.bpe_tokenizer(text[:5000]).save_pretrained(folder)
    assert read_folder(str(folder)).digest() != before


def sentencepiece_llama(folder: Path) -> tuple[Any, Path, str, Any, Any]:
    """A tiny Llama folder with a SentencePiece tokenizer as Llama folders ship one (512 pieces: 256 byte
    pieces and 256 others): the model, the folder, the text the tokenizer was trained on, the tokenizer, and
    the model as a trial builds it."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_lm.llama_config(vocab=512)).eval()
    model.save_pretrained(folder)
    text = tiny_lm.stdlib_text()
    tokenizer = tiny_lm.sentencepiece_folder(folder, text)
    return model, folder, text, tokenizer, build_model(resolve_model(str(folder), None, "input_ids:int64:16:0-512"))


def test_an_ipex_trial_reads_the_prompts_the_main_runtime_encoded_from_a_folders_text(ipex_runtime, tmp_path):
    """A text --data is encoded once, by the main runtime, where the study's reference is computed: the trials'
    workload holds those ids, so an IPEX trial (transformers 4.x, whose SentencePiece tokenizer adds a dummy
    prefix that 5.x does not) draws the very prompts the reference and the other engines do."""
    import subprocess

    from autotune.model.generation import GenerationWorkload, prompts
    from autotune.runner.trials import compute_reference

    _, folder, text, _, _ = sentencepiece_llama(tmp_path / "spm")
    sample = tmp_path / "sample.txt"
    sample.write_text(text[-4000:])  # it starts with a space: the two transformers tokenize it apart
    asked = GenerationWorkload(32, 2, 512, 256, str(sample), "total", str(folder))
    model = resolve_model(str(folder), None, "input_ids:int64:32:0-512")
    reference = compute_reference(model, tmp_path / "study", 4, 300, generation=asked)
    given = reference.generation
    assert given is not None and given.tokenizer is None and given.data.endswith(".pt"), given
    script = (
        "import sys, json\n"
        "from autotune.model.generation import GenerationWorkload, prompts\n"
        "workload = GenerationWorkload.from_json(json.loads(sys.argv[1]))\n"
        "print(json.dumps(prompts(workload, 4, 7).tolist()))\n"
    )
    done = subprocess.run(
        [ipex_runtime.python, "-c", script, json.dumps(given.to_json())],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == prompts(asked, 4, 7).tolist()


def test_a_folders_gguf_carries_its_tokenizer_and_generates_its_text_in_llama_cpp(tmp_path):
    """llama.cpp's converter reads the folder's tokenizer (a SentencePiece one, as Llama folders ship): the
    GGUF tokenizes text as transformers does, and llama.cpp greedy-decodes the tokens FP32 eager does; a
    tokenizer the converter cannot read leaves the placeholder vocabulary, and the details say why."""
    import llama_cpp

    from autotune.backends.llamacpp import gguf_export

    model, folder, text, tokenizer, built = sentencepiece_llama(tmp_path / "llama")
    gguf = tmp_path / "model.gguf"
    details = gguf_export.convert(built, "F32", gguf)
    assert details["vocab"] == f"the model's tokenizer, from {folder}", details
    llm = llama_cpp.Llama(str(gguf), n_ctx=1024, verbose=False)
    sample = text[:300]
    ids = tokenizer.encode(sample, add_special_tokens=False)
    assert llm.tokenize(sample.encode(), add_bos=False) == ids
    prompt = ids[:24]
    with torch.no_grad():
        eager = model.generate(torch.tensor([prompt]), max_new_tokens=4, do_sample=False)[0, len(prompt) :].tolist()
    llm.reset()
    llm.eval(prompt)
    decoded = []
    for _ in range(4):
        token = int(llm.sample(temp=0.0))
        decoded.append(token)
        llm.eval([token])
    assert decoded == eager
    completion = llm(sample[:60], max_tokens=8, temperature=0.0)["choices"][0]["text"]
    assert isinstance(completion, str) and completion.strip()  # text, through llama.cpp's own detokenizer
    # a BPE whose pre-tokenizer llama.cpp does not know: the placeholder vocabulary, and why
    other, _ = llama_folder(tmp_path / "bpe")
    tiny_lm.bpe_tokenizer(text).save_pretrained(other)
    details = gguf_export.convert(
        build_model(resolve_model(str(other), None, "input_ids:int64:16:0-256")), "F32", tmp_path / "b.gguf"
    )
    assert details["vocab"].startswith("placeholder: llama.cpp's converter cannot read the tokenizer"), details


def test_a_folders_ir_carries_its_tokenizer_and_generates_its_text_in_openvino_genai(tmp_path):
    """optimum-cli converts the folder's tokenizer into the IR's folder (openvino-tokenizers): OpenVINO
    GenAI's pipeline tokenizes text as transformers does and greedy-decodes FP32 eager's tokens from the text
    itself."""
    import openvino_genai

    from autotune.backends.openvino import ir_export

    model, folder, text, tokenizer, built = sentencepiece_llama(tmp_path / "llama")
    out = tmp_path / "ir"
    details = ir_export.export(built, "fp32", out)
    assert details["tokenizer"] == f"the model's tokenizer, from {folder}", details
    pipe = openvino_genai.LLMPipeline(str(out), "CPU")
    prompt = text[:80]
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    encoded = pipe.get_tokenizer().encode(prompt, add_special_tokens=False).input_ids.data
    assert encoded.reshape(-1).tolist() == ids
    config = openvino_genai.GenerationConfig()
    config.max_new_tokens = 4
    config.ignore_eos = True
    config.apply_chat_template = False
    inputs = pipe.get_tokenizer().encode(prompt)  # with its BOS, as transformers' encode adds it
    assert inputs.input_ids.data.reshape(-1).tolist() == tokenizer.encode(prompt)
    tokens = pipe.generate(inputs, config).tokens[0]
    with torch.no_grad():
        eager = model.generate(torch.tensor([tokenizer.encode(prompt)]), max_new_tokens=4, do_sample=False)
    assert list(tokens) == eager[0, -4:].tolist()
    text = pipe.generate([prompt], config).texts[0]  # text in, text out, through its own detokenizer
    assert isinstance(text, str) and text


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _completion(port: int, prompt: str, deadline_s: float = 120) -> dict:
    """llama-server's /completion, once it answers /health (it loads the model first)."""
    import time
    import urllib.error
    import urllib.request

    end = time.monotonic() + deadline_s
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as reply:
                if reply.status == 200:
                    break
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        assert time.monotonic() < end, "llama-server did not come up"
        time.sleep(0.5)
    body = json.dumps({"prompt": prompt, "n_predict": 6, "temperature": 0, "ignore_eos": True}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/completion", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.loads(reply.read())


@pytest.mark.slow
def test_the_winners_of_a_folder_search_deploy_in_llama_server_and_openvino_genai(searcher, cli, workdir):
    """`autotune export --format llama-server` and `--format openvino-genai` write each engine's best trial as
    its users deploy it: the GGUF and a llama-server command that answers a completion over HTTP; the IR with
    its tokenizer and an LLMPipeline runner that turns a prompt into text. Their settings are the trial's."""
    import signal
    import subprocess

    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    folder = workdir / "my-llama"
    LlamaForCausalLM(tiny_lm.llama_config(vocab=512)).eval().save_pretrained(folder)
    text = tiny_lm.stdlib_text()
    tiny_lm.sentencepiece_folder(folder, text)
    data = workdir / "text.txt"
    data.write_text(text[:20000])
    none_yet = cli("export", "--study", "my-llama", "--format", "llama-server", timeout=120)
    assert none_yet.returncode == 2 and "Traceback" not in none_yet.stderr
    backends = {
        "eager": {"precision": ["fp32"], "kv_cache": ["dynamic"]},
        # a head of 16 wide: llama.cpp's q8_0 KV cache needs 32
        "llamacpp": {"precision": ["F32"], "n_ubatch": [256], "kv_cache_type": ["f16"], "flash_attn": [False]},
        "openvino": {"precision": ["fp32"], "kv_cache_precision": ["f16"], "inference_precision": ["f32"]},
    }
    space = generation_space(workdir / "space.yaml", backends)
    words = ["--model", str(folder), "--space", str(space), "--data", str(data), *QUICK_GENERATION, *GENERATE]
    assert_trials_ran(searcher("search", *words, "--trials", "3"))

    exported = cli("export", "--study", "my-llama", "--format", "llama-server", timeout=300)
    assert exported.returncode == 0, exported.stderr
    study_folder = workdir / "studies" / "my-llama"
    script = (study_folder / "llama-server.sh").read_text()
    for flag in ("--ubatch-size 256", "--cache-type-k f16", "--flash-attn off", "--parallel 2"):
        assert flag in script, script
    port = _free_port()
    server = subprocess.Popen(
        [str(study_folder / "llama-server.sh")],
        env={**os.environ, "PORT": str(port)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        reply = _completion(port, text[:60])
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    assert reply["tokens_predicted"] == 6 and isinstance(reply["content"], str), reply

    deploy = workdir / "deploy" / "genai"  # -o: a folder of its own, made as needed
    genai = cli("export", "--study", "my-llama", "--format", "openvino-genai", "-o", str(deploy), timeout=300)
    assert genai.returncode == 0, genai.stderr
    settings = json.loads((deploy / "openvino-genai.json").read_text())
    assert settings["properties"]["KV_CACHE_PRECISION"] == "f16", settings
    assert (deploy / "openvino-genai" / "openvino_tokenizer.xml").is_file()
    ran = subprocess.run(
        [str(deploy / "openvino-genai.sh"), text[:60], "6"], capture_output=True, text=True, timeout=300
    )
    assert ran.returncode == 0 and ran.stdout.strip(), ran.stderr[-2000:]
