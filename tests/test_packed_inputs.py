"""Packed step inputs (OCTAVO_PACKED_INPUTS): every per-step field a typed view of one host
arena mirrored by one device arena, a step's uploads one copy of the byte range it wrote.

On the CPU the device path is simulated: ``mirror=True`` gives device tensors apart from the
host ones (plain CPU tensors), so a field read before the flush, or a flush that sent stale
bytes over what the device should hold, shows as different values or different tokens."""

from __future__ import annotations

import functools
import random

import numpy as np
import pytest
import torch

from octavo.worker import input_buffers, model_runner
from octavo.worker.input_buffers import ALIGN, InputBuffers, arena_layout, copy_span

CPU = torch.device("cpu")


def _packed(max_tokens=512, max_reqs=8, max_blocks=16) -> InputBuffers:
    return InputBuffers(max_tokens, max_reqs, max_blocks, CPU, packed=True, mirror=True)


def _fields(b: InputBuffers) -> dict:
    names = [s[0] for s in input_buffers.field_specs(b.max_tokens, b.max_reqs, b.max_blocks,
                                                      decode_rows=True)]
    out = {}
    for name in names:
        if name.startswith("decode_"):
            b.use_decode_rows(True)
            out[name] = getattr(b, name[len("decode_"):])
            b.use_decode_rows(False)
        else:
            out[name] = getattr(b, name)
    return out


# ---------------------------------------------------------------- layout

def test_layout_aligned_in_order_without_overlap():
    specs = input_buffers.field_specs(8192, 256, 128, decode_rows=True)
    layout, nbytes = arena_layout([s[:3] for s in specs])
    assert ALIGN >= 16 and nbytes % ALIGN == 0
    end = 0
    for name, shape, dtype, _ in specs:
        off, size = layout[name]
        assert off % ALIGN == 0 and off >= end, name
        assert size == int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
        end = off + size
    assert end <= nbytes


def test_views_are_typed_slices_of_one_arena_same_offsets_both_sides():
    b = _packed()
    host, dev = b.arena.host, b.arena.dev
    assert host.data_ptr() != dev.data_ptr()
    dtypes = {"input_ids": torch.int64, "positions": torch.int64, "slot_mapping": torch.int64,
              "query_start_loc": torch.int32, "seq_lens": torch.int32,
              "req_tables": torch.int32, "table_slots": torch.int64,
              "logits_indices": torch.int64, "temperature": torch.float32,
              "top_k": torch.int64, "top_p": torch.float32, "min_p": torch.float32,
              "fix_dst": torch.int64, "fix_src": torch.int64}
    for name, buf in _fields(b).items():
        off, size = b.layout[name]
        assert buf.cpu.dtype == buf.gpu.dtype == dtypes[name.removeprefix("decode_")]
        assert buf.cpu.data_ptr() - host.data_ptr() == off, name
        assert buf.gpu.data_ptr() - dev.data_ptr() == off, name
        assert buf.cpu.numel() * buf.cpu.element_size() == size
        assert buf.np.ctypes.data == buf.cpu.data_ptr()
        assert buf.gpu.is_contiguous() and buf.gpu.data_ptr() % 16 == 0
    assert b.req_tables.cpu.shape == (b.max_reqs + 1, b.max_blocks)
    assert b.input_ids.cpu.shape == (b.max_tokens,)
    b.use_decode_rows(True)
    assert b.input_ids.cpu.shape == (b.max_reqs,)
    # Fills: the device side starts as the host side (slots -1, the padding table row 0).
    assert (b.slot_mapping.gpu == -1).all() and (b.req_tables.gpu == 0).all()
    assert torch.equal(b.arena.host, b.arena.dev)
    # Device-only block tables stay out of the arena.
    assert not (dev.data_ptr() <= b.block_tables.gpu.data_ptr() < dev.data_ptr() + dev.numel())


def test_flag_and_cpu_defaults(monkeypatch):
    monkeypatch.delenv("OCTAVO_PACKED_INPUTS", raising=False)
    b = InputBuffers(64, 4, 8, CPU)  # the CPU: plain tensors, no copies, as before
    assert not b.packed and b.arena is None
    assert b.input_ids.gpu is b.input_ids.cpu
    assert b.seq_lens.put([3, 4]).data_ptr() == b.seq_lens.cpu.data_ptr()
    assert InputBuffers(64, 4, 8, CPU, mirror=True).packed  # default on
    monkeypatch.setenv("OCTAVO_PACKED_INPUTS", "0")
    off = InputBuffers(64, 4, 8, CPU, mirror=True)
    assert not off.packed and off.arena is None
    assert off.input_ids.gpu is not off.input_ids.cpu
    assert torch.equal(off.seq_lens.put([3, 4]), torch.tensor([3, 4], dtype=torch.int32))
    off.use_decode_rows(True)  # one set of token rows when unpacked
    assert off.input_ids.cpu.shape == (64,)


def test_cpu_fields_behave_as_before():
    """On the CPU (no mirror): put/upload return the host rows, the block tables are gathered
    at once, flush does nothing."""
    b = InputBuffers(64, 4, 8, CPU)
    s0, s1 = b.take_slot(), b.take_slot()
    b.req_tables.np[s0, :2] = [5, 6]
    b.req_tables.np[s1, :1] = [7]
    b.table_slots.np[:3] = [s1, s0, b.pad_slot]
    out = b.gather_block_tables(3)
    assert out.tolist()[0][:2] == [7, 0] and out.tolist()[1][:2] == [5, 6]
    assert out.tolist()[2] == [0] * 8
    assert b.pending_copy() is None
    b.flush()
    assert b.temperature.put([0.5, 1.0]).tolist() == [0.5, 1.0]


# ---------------------------------------------------------------- the copied range

def test_copy_span():
    assert copy_span([]) is None
    assert copy_span([(10, 10), (5, 5)]) is None
    assert copy_span([(100, 108), (0, 8)]) == (0, 108)
    assert copy_span([(64, 80), (64, 64), (200, 300), (128, 129)]) == (64, 300)


def test_decode_step_copies_one_small_range():
    b = _packed(max_tokens=8192, max_reqs=32, max_blocks=64)
    lay = b.layout
    slot = b.take_slot()
    b.use_decode_rows(True)
    b.input_ids.put([11])
    b.positions.put([4])
    b.slot_mapping.put([4])
    b.query_start_loc.put([0, 1])
    b.seq_lens.put([5])
    b.table_slots.np[0] = slot
    b.gather_block_tables(1)
    table_row = b.max_blocks * 4
    assert b.pending_copy() == (lay["decode_input_ids"][0], lay["req_tables"][0] + table_row)
    assert b.pending_copy()[1] - b.pending_copy()[0] < 2048  # not the 64 KiB token fields
    # An in-flight token fix starts the range at fix_dst; sampling parameters at theirs.
    b.fix_dst.put([0])
    assert b.pending_copy()[0] == lay["fix_dst"][0]
    b.temperature.put([0.7])
    assert b.pending_copy()[0] == lay["temperature"][0]
    copies = b.arena.copies
    b.flush()
    assert b.arena.copies == copies + 1 and b.pending_copy() is None
    b.flush()  # nothing written: no copy
    assert b.arena.copies == copies + 1


def test_mixed_step_range_and_dirty_rows():
    b = _packed(max_tokens=256, max_reqs=8, max_blocks=16)
    for _ in range(3):
        b.take_slot()
    b.use_decode_rows(False)
    b.input_ids.upload(40)
    b.positions.upload(40)
    b.slot_mapping.upload(40)
    b.logits_indices.upload(2)
    b.gather_block_tables(2)
    lo, hi = b.pending_copy()
    assert lo == 0 and hi == b.layout["req_tables"][0] + 3 * b.max_blocks * 4


# ---------------------------------------------------------------- simulated device

def _random_step(rng, bufs: list[InputBuffers], live: list, decode: bool) -> dict:
    """Write the same random step into each buffers' host side and upload it; returns the
    rows each field's device side must hold after the flush, per field name."""
    b0 = bufs[0]
    nreq = rng.randint(1, len(live))
    t = nreq if decode else rng.randint(nreq, b0.max_tokens)
    want = {}
    for b in bufs:
        b.use_decode_rows(decode)
    writes = {"input_ids": t, "positions": t, "slot_mapping": t, "query_start_loc": nreq + 1,
              "seq_lens": nreq}
    for name in ("logits_indices", "temperature", "top_k", "top_p", "min_p", "fix_dst",
                 "fix_src"):
        if rng.random() < 0.4:
            writes[name] = rng.randint(1, nreq)
    for name, n in writes.items():
        vals = np.asarray([rng.randrange(-5, 1000) for _ in range(n)])
        for b in bufs:
            getattr(b, name).put(vals)
        want[name] = vals
    # Block tables: append ids to some live slots' rows; the step's slots.
    for slot in live:
        if rng.random() < 0.5:
            col = rng.randrange(b0.max_blocks)
            val = rng.randrange(1, 10000)
            for b in bufs:
                b.req_tables.np[slot, col] = val
    slots = [rng.choice(live) for _ in range(nreq)]
    for b in bufs:
        b.table_slots.np[:nreq] = slots
        b.gather_block_tables(nreq)
    want["block_tables"] = b0.req_tables.np[slots].copy()
    return want


def test_simulated_device_matches_per_field_copies():
    """Random steps (decode and mixed, fields written only on some steps, slots taken and
    released, device-side token fixes as in asynchronous scheduling) through packed buffers
    and per-field buffers with separate "device" tensors: after each flush every field's rows
    the step wrote, the gathered block tables and the live rows of the persistent table are
    the same on both devices, and equal to the host's."""
    rng = random.Random(0)
    packed = _packed(max_tokens=64, max_reqs=6, max_blocks=5)
    plain = InputBuffers(64, 6, 5, CPU, packed=False, mirror=True)
    bufs = [packed, plain]
    live: list[int] = []
    for step in range(300):
        if not live or (len(live) < 6 and rng.random() < 0.3):
            slots = {b.take_slot() for b in bufs}
            assert len(slots) == 1
            live.append(slots.pop())
        elif rng.random() < 0.2:
            slot = live.pop(rng.randrange(len(live)))
            for b in bufs:
                b.release_slot(slot)
        want = _random_step(rng, bufs, live, decode=rng.random() < 0.6)
        for b in bufs:
            b.flush()
        for name, vals in want.items():
            for b in bufs:
                dev = getattr(b, name).gpu[: len(vals)].numpy()
                np.testing.assert_array_equal(dev, vals.astype(dev.dtype), err_msg=name)
        for slot in live + [packed.pad_slot]:
            np.testing.assert_array_equal(packed.req_tables.gpu[slot].numpy(),
                                          plain.req_tables.gpu[slot].numpy())
            np.testing.assert_array_equal(packed.req_tables.gpu[slot].numpy(),
                                          packed.req_tables.np[slot])
        # The device-side fix of in-flight tokens (ModelRunner._feed_in_flight_tokens).
        n = len(want["input_ids"])
        dst = torch.tensor([rng.randrange(n)])
        for b in bufs:
            b.input_ids.gpu.index_copy_(0, dst, torch.tensor([-step]))
    assert packed.arena.copies == 300


# ---------------------------------------------------------------- the engine on the CPU

@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    from tests.tiny_models import make_checkpoint

    return make_checkpoint("llama", str(tmp_path_factory.mktemp("packed_inputs")))


def _generate(folder, monkeypatch, packed: bool, logprobs: int | None, **kwargs):
    from octavo import LLM, SamplingParams

    monkeypatch.setattr(model_runner, "InputBuffers",
                        functools.partial(InputBuffers, packed=packed, mirror=True))
    rng = random.Random(3)
    prompts = [[rng.randrange(3, 500) for _ in range(rng.randint(1, 60))] for _ in range(7)]
    params = [SamplingParams(temperature=0.0 if i % 3 == 0 else 0.5 + 0.2 * i, seed=i,
                             top_k=20 if i == 1 else -1, top_p=0.9 if i == 2 else 1.0,
                             min_p=0.05 if i == 4 else 0.0, max_tokens=6 + 3 * i,
                             logprobs=logprobs, ignore_eos=True)
              for i in range(len(prompts))]
    llm = LLM(model=folder, dtype="float32", skip_tokenizer_init=True, max_model_len=128,
              block_size=4, max_num_batched_tokens=32, max_num_seqs=4, **kwargs)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    runner = llm.llm_engine.executor.worker.runner
    assert runner.buf.packed == packed
    got = [[(list(c.token_ids), [lp[t].logprob for lp, t in zip(c.logprobs or [], c.token_ids)])
            for c in o.outputs] for o in outs]
    return got, runner


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_engine_outputs_match_with_simulated_device(folder, monkeypatch, async_scheduling):
    """Mixed and decode steps, chunked prefills, greedy and sampled rows (temperature, top-k,
    top-p, min-p, seeds), a table of more requests than max_num_seqs over time: the same
    tokens and logprobs packed and per field, over a simulated device. Asynchronous: without
    logprobs (they keep a request's steps from overlapping), tokens fed on the device."""
    lp = None if async_scheduling else 1
    ref, _ = _generate(folder, monkeypatch, False, lp, async_scheduling=async_scheduling)
    got, runner = _generate(folder, monkeypatch, True, lp, async_scheduling=async_scheduling)
    assert got == ref
    assert runner.buf.arena.copies > 0
    if async_scheduling:
        assert runner.num_tokens_fed_on_device > 0


# ---------------------------------------------------------------- the GPU

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _sampled_decode(model_dir, liven, enforce_eager: bool) -> list:
    """Six prompts at once, each its own temperature (one greedy) and seed, no logprobs (so
    steps overlap: tokens fed on the device): the tokens per prompt."""
    import gc

    from octavo import LLM, SamplingParams, envs
    from tests.kernels import cuda_checks

    params = [SamplingParams(temperature=[0.0, 0.3, 0.7, 1.0, 1.3, 0.9][i], seed=100 + i,
                             top_p=0.95 if i == 5 else 1.0, max_tokens=12, ignore_eos=True)
              for i in range(len(cuda_checks.PROMPTS))]
    llm = LLM(model=str(model_dir), load_format="dummy", dtype="bfloat16", seed=0,
              skip_tokenizer_init=True, max_model_len=256, gpu_memory_utilization=0.2,
              enforce_eager=enforce_eager)
    runner = llm.llm_engine.executor.worker.runner
    liven(runner.model)
    assert runner.buf.packed == envs.packed_inputs()
    outs = [list(o.outputs[0].token_ids)
            for o in llm.generate(cuda_checks.PROMPTS, params, use_tqdm=False)]
    assert runner.num_tokens_fed_on_device > 0
    del llm, runner
    gc.collect()
    torch.cuda.empty_cache()
    return outs


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("eager", [True, False])
def test_engine_decodes_match_gpu(tmp_path, monkeypatch, eager):
    """A bf16 Llama's greedy decodes (one prompt, then six at once: tokens and logprobs) and
    a batch sampled at six temperatures (tokens): the same, bit for bit, with
    OCTAVO_PACKED_INPUTS on and off, eager and with CUDA graphs."""
    import json

    from tests.kernels import cuda_checks
    from tests.kernels.test_dense_mma import _liven

    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
              "intermediate_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 8,
              "num_key_value_heads": 4, "vocab_size": 2048, "max_position_embeddings": 512,
              "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    runs = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("OCTAVO_PACKED_INPUTS", flag)
        runs[flag] = (cuda_checks.greedy_decode(tmp_path, _liven, eager,
                                                prompts=cuda_checks.PROMPTS[:1]),
                      cuda_checks.greedy_decode(tmp_path, _liven, eager),
                      _sampled_decode(tmp_path, _liven, eager))
    assert runs["1"] == runs["0"]
