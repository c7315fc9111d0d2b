"""Tensor parallelism on this CPU (issue 14 item 2): two worker processes joined by gloo give
the same greedy tokens as one rank, in float32, for each family (mixtures of experts too), with fewer KV heads than ranks
(replicated), with a vocabulary that does not split evenly (vocab-parallel embedding and LM
head, tied and not), and for a GPTQ checkpoint sharded by the same loader (its LM head
quantized too, or not); shapes that do not divide are refused before anything starts, naming
them."""

from __future__ import annotations

import pytest

from octavo import LLM, SamplingParams
from tests.tiny_models import make_checkpoint

GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
PROMPTS = [{"prompt_token_ids": [(7 * i + 3 * n) % 500 for i in range(n)]} for n in (1, 6, 13)]


def _tokens(path, tp, **kw):
    llm = LLM(model=path, dtype="float32", skip_tokenizer_init=True, max_model_len=64,
              tensor_parallel_size=tp, **kw)
    try:
        outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        return [o.outputs[0].token_ids for o in outs]
    finally:
        llm.llm_engine.shutdown()


# Each case starts two worker processes (~10 s on CI's two cores), so each one adds a
# feature: a vocabulary that splits evenly (512) is the dense families' and the experts'.
@pytest.mark.parametrize("family,overrides", [
    # A vocabulary that does not split evenly: the last rank's table ends in a zero padding
    # row, sliced off the gathered logits (untied here; tied below, where the LM head shares
    # the embedding's shard).
    ("llama", {"vocab_size": 501}),
    ("qwen2", {}),  # q/k/v biases, split with their rows
    # One KV head for two ranks (replicated), and the tied uneven vocabulary.
    ("qwen3", {"num_key_value_heads": 1, "vocab_size": 501}),
    # Experts: each rank holds half of every expert's intermediate features.
    ("qwen3_moe", {}),
    ("qwen2_moe", {}),  # and a shared expert, column / row parallel like a dense MLP
    ("mixtral", {}),
])
def test_tp2_equals_tp1(tmp_path, family, overrides):
    path = make_checkpoint(family, str(tmp_path / family), **overrides)
    one = _tokens(path, 1)
    assert _tokens(path, 2) == one


def test_tp2_gptq_checkpoint(tmp_path):
    """The packed GPTQ tensors are narrowed per rank by the same attribute-driven loader; a
    rank's shard that no longer holds whole groups is refused, naming the layer."""
    from tests.quantization.test_gptq_awq_checkpoints import _write_pair

    qcfg = {"bits": 4, "group_size": 32, "desc_act": False, "sym": True,
            "checkpoint_format": "gptq_v2"}
    src = make_checkpoint("llama", str(tmp_path / "src"))
    _, quant = _write_pair(src, str(tmp_path / "g32"), qcfg, "quantize_config.json")
    assert _tokens(quant, 2) == _tokens(quant, 1)
    _, g64 = _write_pair(src, str(tmp_path / "g64"), dict(qcfg, group_size=64),
                         "quantize_config.json")
    with pytest.raises(RuntimeError, match="o_proj'.*not divisible by group_size"):
        _tokens(g64, 2)  # hidden 64 over two ranks: 32 inputs, not a group of 64


# Qwen3 only: its quantized head narrows as an untied one would (Llama's GPTQ layers under
# two ranks are test_tp2_gptq_checkpoint's), and its tied embedding stays float besides.
@pytest.mark.parametrize("family", ["qwen3"])
def test_tp2_gptq_checkpoint_with_a_quantized_lm_head(tmp_path, family):
    """GPTQModel's lm_head=True: each rank holds its vocab rows of the quantized head (packed
    zeros narrowed along the output) and the gathered logits give rank 1's tokens; Qwen3's
    tied embedding stays float while the head is the checkpoint's."""
    from tests.quantization.test_gptq_awq_checkpoints import _write_pair

    qcfg = {"bits": 4, "group_size": 32, "desc_act": False, "sym": True,
            "checkpoint_format": "gptq_v2", "lm_head": True}
    src = make_checkpoint(family, str(tmp_path / "src"))
    _, quant = _write_pair(src, str(tmp_path / "q"), qcfg, "quantize_config.json")
    assert _tokens(quant, 2) == _tokens(quant, 1)


def test_shapes_that_do_not_divide_are_refused_first(tmp_path):
    path = make_checkpoint("llama", str(tmp_path / "odd"), num_attention_heads=4,
                           num_key_value_heads=2)
    with pytest.raises(ValueError, match="tensor_parallel_size=3 does not divide the model's "
                                         "4 attention heads"):
        LLM(model=path, dtype="float32", skip_tokenizer_init=True, tensor_parallel_size=3)
    with pytest.raises(ValueError, match="needs one process per rank"):
        LLM(model=path, dtype="float32", skip_tokenizer_init=True, tensor_parallel_size=2,
            distributed_executor_backend="uni")
    with pytest.raises(ValueError, match="tensor_parallel_size must be (an integer )?>= 1"):
        LLM(model=path, dtype="float32", skip_tokenizer_init=True, tensor_parallel_size=0)


def test_quantized_gguf_is_refused_under_tp():
    from octavo.default_model import default_model_path

    with pytest.raises(ValueError, match="quantization='gguf' .* tensor_parallel_size > 1"):
        LLM(model=default_model_path(), quantization="gguf", device="cpu",
            tensor_parallel_size=3)


def test_vocab_parallel_rows_and_logits_in_one_process(monkeypatch):
    """The vocab-parallel table split by hand: each rank's rows (padding zero), lookups that
    sum to the full table's, LM head logits that concatenate to the full product."""
    import torch

    from octavo.distributed import parallel_state
    from octavo.layers.vocab_embedding import LMHead, VocabEmbedding

    full = torch.randn(501, 8)
    ids = torch.tensor([0, 250, 251, 500, 7])
    hidden = torch.randn(3, 8)
    lookups, logits = [], []
    for rank in range(2):
        monkeypatch.setattr(parallel_state, "_TP", parallel_state.TPGroup(rank, 2))
        monkeypatch.setattr(parallel_state.TPGroup, "all_reduce", lambda self, x: x)
        monkeypatch.setattr(parallel_state.TPGroup, "all_gather", lambda self, x, dim=-1: x)
        emb = VocabEmbedding(501, 8)
        emb.weight.weight_loader(emb.weight, full)
        assert emb.weight.shape == (251, 8)
        if rank == 1:
            assert torch.equal(emb.weight[:250], full[251:]) and not emb.weight[250].any()
        lookups.append(emb(ids))
        head = LMHead(501, 8)
        head.tie(emb)
        head.process_weights_after_loading()
        logits.append(head.forward(hidden))
    assert torch.equal(lookups[0] + lookups[1], full[ids])
    torch.testing.assert_close(torch.cat(logits, dim=-1)[:, :501], hidden @ full.T)
    with pytest.raises(ValueError, match=r"vocabulary table \(500, 8\), expected \(501, 8\)"):
        emb.weight.weight_loader(emb.weight, full[:500])
