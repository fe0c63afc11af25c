"""``export --format hf``: the safetensors file, the name mapping, and transformers' logits.

The logits check needs torch and transformers, which minipar does not depend on: it runs
where this Python has them, or in the Python named by MINIPAR_HF_PYTHON, else it is skipped.
"""
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from minipar.export import safetensors_file
from tests.mpirun import REPO


def run_cli(args, timeout=300):
    """python -m minipar ARGS from the repository root, one BLAS thread."""
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "minipar", *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_safetensors_round_trip_streams_in_order(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {"a": rng.standard_normal((3, 5)).astype(np.float32), "b.c": np.arange(7, dtype=np.int64),
               "empty": np.zeros((0, 4), np.float16), "d": rng.standard_normal(2)}
    produced = []

    def produce(name):
        produced.append(name)
        return tensors[name]
    entries = [(k, v.shape, v.dtype) for k, v in tensors.items()]
    path = str(tmp_path / "m.safetensors")
    safetensors_file.write(path, entries, produce, metadata={"format": "pt"})
    assert produced == list(tensors)                      # one tensor at a time, in order
    back = safetensors_file.read(path)
    assert set(back) == set(tensors)
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and np.array_equal(back[k], v), k
    n = int.from_bytes(open(path, "rb").read(8), "little")
    assert n % 8 == 0
    header = json.loads(open(path, "rb").read(8 + n)[8:])
    assert header["__metadata__"] == {"format": "pt"}
    assert header["a"]["data_offsets"] == [0, 60] and header["a"]["dtype"] == "F32"
    if importlib.util.find_spec("safetensors"):           # the reference reader agrees
        from safetensors.numpy import load_file
        theirs = load_file(path)
        for k, v in tensors.items():
            assert np.array_equal(theirs[k], v), k


def test_a_shape_that_does_not_match_its_declaration_leaves_no_file(tmp_path):
    path = str(tmp_path / "m.safetensors")
    with pytest.raises(ValueError, match="declared"):
        safetensors_file.write(path, [("a", (2, 2), np.float32)], lambda n: np.zeros(3, np.float32))
    assert os.listdir(tmp_path) == []


def _hf_python():
    if importlib.util.find_spec("transformers") and importlib.util.find_spec("torch"):
        return sys.executable
    return os.environ.get("MINIPAR_HF_PYTHON")


SLOW = pytest.mark.slow     # by default one gpt2 and the llama; the untied, padded and MoE exports in the slow run


@pytest.mark.parametrize("flags, architecture", [
    pytest.param(["--model", "tiny"], "GPT2LMHeadModel", marks=SLOW),
    (["--model", "tiny", "--tie-weights"], "GPT2LMHeadModel"),
    (["--model", "llama-tiny", "--n-kv-head", "2", "--rope-theta", "500"], "LlamaForCausalLM"),
    pytest.param(["--model", "tiny", "--pad-vocab-to", "96"], "GPT2LMHeadModel", marks=SLOW),
    pytest.param(["--model", "llama-tiny", "--n-kv-head", "2", "--moe-experts", "4", "--moe-top-k", "2"],
                 "MixtralForCausalLM", marks=SLOW)],
    ids=["gpt2-untied", "gpt2-tied", "llama-gqa", "gpt2-padded-vocab", "mixtral"])
def test_exported_model_gives_minipar_logits_in_transformers(tmp_path, flags, architecture):
    run = tmp_path / "run"
    out = run_cli(["train", *flags, "--steps", "3", "--batch-size", "2", "--eval-batches", "0",
                   "--quiet", "--save", str(run)])
    assert out.returncode == 0, out.stderr
    hf_dir = tmp_path / "hf"
    out = run_cli(["export", str(run), "--format", "hf", "--out", str(hf_dir)])
    assert out.returncode == 0, out.stderr
    config = json.loads((hf_dir / "config.json").read_text())
    assert config["architectures"] == [architecture]
    tensors = safetensors_file.read(str(hf_dir / "model.safetensors"))
    names = set(tensors)
    embedding = tensors.get("transformer.wte.weight", tensors.get("model.embed_tokens.weight"))
    assert embedding.shape[0] == config["vocab_size"]        # a padded vocabulary cut back to V
    assert ("transformer.h.0.attn.c_attn.weight" if architecture == "GPT2LMHeadModel"
            else "model.layers.0.self_attn.k_proj.weight") in names
    if architecture == "MixtralForCausalLM":                 # the Hub's layout, (out, in)
        assert config["num_local_experts"] == 4 and config["num_experts_per_tok"] == 2
        assert tensors["model.layers.0.block_sparse_moe.gate.weight"].shape == (4, config["hidden_size"])
        assert tensors["model.layers.1.block_sparse_moe.experts.3.w1.weight"].shape == (
            config["intermediate_size"], config["hidden_size"])
        assert tensors["model.layers.1.block_sparse_moe.experts.3.w2.weight"].shape == (
            config["hidden_size"], config["intermediate_size"])
        assert not any(".mlp." in name for name in names)
    assert ("lm_head.weight" in names) == ("--tie-weights" not in flags)

    from minipar.sample import load_model
    from minipar import backend
    model, _ = load_model(str(run))
    from minipar.checkpoint import open_checkpoint
    saved = open_checkpoint(str(run))
    for name, p in model.named_parameters():          # sample's model is the trained one, all of it
        assert np.array_equal(backend.to_host(p.data), saved.tensor(name)), name
    ids = np.random.default_rng(1).integers(0, config["vocab_size"], size=(2, 40))
    mine = backend.to_host(model(backend.to_device(ids)).data).astype(np.float64)
    python = _hf_python()
    if python is None:
        pytest.skip("transformers and torch are not installed (set MINIPAR_HF_PYTHON to a Python that has them)")
    np.save(tmp_path / "ids.npy", ids)
    proc = subprocess.run([python, os.path.join(REPO, "tests", "scripts", "hf_logits.py"), str(hf_dir),
                           str(tmp_path / "ids.npy"), str(tmp_path / "theirs.npy")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = np.load(tmp_path / "theirs.npy")
    assert theirs.shape == mine.shape
    relative = np.abs(theirs - mine).max() / np.abs(mine).max()
    print(f"max |transformers - minipar| / max |minipar| = {relative:.2e}")
    assert relative <= (1e-5 if architecture == "MixtralForCausalLM" else 1e-4), relative
    if architecture == "MixtralForCausalLM":   # the check can see which expert is which
        experts = model.blocks[0].mlp.experts
        experts[0], experts[1] = experts[1], experts[0]
        other = backend.to_host(model(backend.to_device(ids)).data).astype(np.float64)
        missed = np.abs(theirs - other).max() / np.abs(mine).max()
        print(f"with experts 0 and 1 of block 0 swapped: {missed:.2e}")
        assert missed > 20 * max(relative, 1e-6), (missed, relative)
    if architecture == "LlamaForCausalLM":     # the check can see RoPE: another base misses by far more
        model.rope.base, model.rope._cache = 10000.0, {}
        other = backend.to_host(model(backend.to_device(ids)).data).astype(np.float64)
        missed = np.abs(theirs - other).max() / np.abs(mine).max()
        print(f"with RoPE base 10000 instead of 500: {missed:.2e}")
        assert missed > 20 * max(relative, 1e-6), (missed, relative)


@pytest.mark.parametrize("field, value, reason", [
    ("moe_shared_experts", 1, "no shared experts"), ("moe_every", 2, "none dense"),
    ("moe_balance", "bias", "no selection bias"), ("moe_capacity_factor", 1.0, "no capacity")])
def test_a_mixture_of_experts_mixtral_lacks_is_refused_in_one_line(field, value, reason):
    """What Mixtral has no place for is refused, never written as something else."""
    from minipar.export.hf import mapping, mixtral_name
    moe = {"arch": "llama", "moe_experts": 4, "moe_top_k": 2}
    with pytest.raises(ValueError, match=f"cannot export as Mixtral: .*{reason}") as err:
        mapping({**moe, field: value})
    assert "\n" not in str(err.value)
    assert mapping(moe)[0] is mixtral_name
    assert mapping({"arch": "llama", "moe_experts": 0})[0]("blocks.0.mlp.up_proj.weight") == (
        "model.layers.0.mlp.up_proj.weight", True)           # a dense llama keeps llama's names
