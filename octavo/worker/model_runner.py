"""Turns a SchedulerOutput into flat tensors, runs the model, samples.

The batch is flat and unpadded: the tokens each request computes this step, back to back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from octavo.attention.backend import AttentionMetadata
from octavo.attention.layer import ForwardContext
from octavo.attention.registry import select_backend
from octavo.config import EngineConfig
from octavo.core.scheduler_output import ModelRunnerOutput, SchedulerOutput
from octavo.model_loader.loader import TORCH_DTYPES, load_model
from octavo.sample.grammar_mask import GrammarMask
from octavo.sample.logits_processors import (
    BadWordIndex,
    RowContext,
    needs_processing,
)
from octavo.sample.metadata import SamplingMetadata
from octavo.sample.penalty_rows import PenaltyRows
from octavo.sample.sampler import Sampler
from octavo.sample.upload import to_device
from octavo.sampling_params import SamplingType
from octavo.structured_output.bitmask import GrammarBitmask
from octavo.worker import logprobs
from octavo.worker.cuda_graphs import CudaGraphRunner
from octavo.worker.input_buffers import InputBuffers
from octavo.worker.kv_cache import allocate_kv_caches, kv_bytes_per_block
from octavo.worker.request_state import CachedRequestState
from octavo.worker.sampler_profile import sample_worst_case
from octavo.worker.step_handle import PendingSample, StepHandle

logger = logging.getLogger(__name__)

_SEED_STRIDE = 0x9E3779B1  # spreads (seed, step) pairs over the generator's seed space


@dataclass
class _Sample:
    """A launched step's sampling: call it with the guided rows' bitmask (or None)."""

    run: Callable[[GrammarBitmask | None], StepHandle]
    req_ids: list[str]  # the requests whose tokens it samples, in row order

    def __call__(self, grammar: GrammarBitmask | None) -> StepHandle:
        return self.run(grammar)


class ModelRunner:
    def __init__(self, config: EngineConfig, device: torch.device) -> None:
        self.config = config
        self.device = device
        mc = config.model_config
        self.dtype = TORCH_DTYPES[mc.dtype]
        # The KV blocks' dtype: the model's, or float8 e4m3 (kv_cache_dtype="fp8").
        self.kv_dtype = (self.dtype if config.cache_config.cache_dtype == "auto"
                         else torch.float8_e4m3fn)
        self.block_size = config.cache_config.block_size
        hf = mc.hf_config
        self.num_layers = hf.num_hidden_layers
        # This rank's KV heads: from hf_config until the model is loaded, then from its
        # attention layers (a tensor-parallel rank holds its share, or one replica).
        self.num_kv_heads = getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads
        self.head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
        self.backend = select_backend(device, config.device_config.attention_backend)
        self.model = None
        self.kv_caches: list[torch.Tensor] = []
        self.swap_cache = None  # a SwapCache when there is swap space (Worker.init_kv_cache)
        self.states: dict[str, CachedRequestState] = {}
        sc = config.scheduler_config
        self.buf = InputBuffers(
            max_tokens=max(sc.max_num_batched_tokens, sc.max_num_seqs, 1),
            max_reqs=sc.max_num_seqs,
            max_blocks=-(-sc.max_model_len // self.block_size),
            device=device)
        self.graph_runner: CudaGraphRunner | None = None
        self.last_prepare_s = 0.0
        self.sampler = Sampler()
        # Penalty counts where the logits are (sample/penalty_rows.py): on CUDA, and wherever
        # steps are launched ahead of their history reaching the host (async scheduling);
        # else the rows' host tallies.
        self.penalty_rows = (PenaltyRows(max(sc.max_num_seqs, 1))
                             if device.type == "cuda" or sc.async_scheduling else None)
        # Asynchronous scheduling: the last step's sampled tokens stay on the device for
        # the next step's inputs; host staging buffers are rewritten only once the device
        # has read them (event); sampled tokens come back through two pinned buffers.
        self._prev_sampled: torch.Tensor | None = None
        # A step launched with defer_sampling, waiting for sample_tokens(bitmask).
        self._deferred: _Sample | None = None
        self._prev_rows: dict[str, int] = {}
        # A guided step's sampling waiting for the next step's host preparation; on CUDA
        # (on the CPU every op runs as it is called: nothing to overlap).
        self._pending: PendingSample | None = None
        self.defer_guided_sampling = self.device.type == "cuda"
        self._fix: list[tuple[int, int]] = []
        self.num_tokens_fed_on_device = 0  # inputs taken from a step still in flight
        self._inputs_sent = None
        on_cuda = device.type == "cuda"
        self._sampled_host = [torch.empty(max(sc.max_num_seqs, 1), dtype=torch.int64,
                                          pin_memory=True) for _ in range(2)] if on_cuda else []
        self._flip = 0
        self.generator = torch.Generator(device=device).manual_seed(mc.seed)
        self._seed_gens: dict[str, torch.Generator] = {}

    # ------------------------------------------------------------------ setup
    def load_model(self) -> None:
        self.model = load_model(self.config.model_config, self.device, self.backend,
                                self.config.quantization)
        from octavo.attention.layer import Attention

        heads = {m.num_kv_heads for m in self.model.modules() if isinstance(m, Attention)}
        if len(heads) == 1:
            self.num_kv_heads = heads.pop()

    def bytes_per_block(self) -> int:
        return kv_bytes_per_block(self.num_layers, self.block_size, self.num_kv_heads,
                                  self.head_dim, self.kv_dtype)

    def init_kv_cache(self, num_blocks: int) -> None:
        self.kv_caches = allocate_kv_caches(self.backend, self.num_layers, num_blocks,
                                            self.block_size, self.num_kv_heads, self.head_dim,
                                            self.kv_dtype, self.device)
        self.num_blocks = num_blocks

    @torch.inference_mode()
    def profile_peak_memory(self) -> int:
        """Run one forward at max_num_batched_tokens on CUDA; return peak bytes allocated."""
        sc = self.config.scheduler_config
        n = min(sc.max_num_batched_tokens, sc.max_num_seqs * sc.max_model_len)
        per_req = min(n, sc.max_model_len)
        num_reqs = -(-n // per_req)
        blocks = num_reqs * (-(-per_req // self.block_size))
        self.init_kv_cache(blocks)
        torch.cuda.reset_peak_memory_stats(self.device)
        states, lens = [], []
        for i in range(num_reqs):
            L = min(per_req, n - i * per_req)
            first = i * (-(-per_req // self.block_size))
            ids = list(range(first, first + -(-L // self.block_size)))
            states.append(CachedRequestState(f"profile-{i}", [0] * L, L, None, ids, 0,
                                             slot=self.buf.take_slot()))
            lens.append(L)
        hidden, _ = self._forward(states, lens, [0] * num_reqs)
        for st in states:
            self.buf.release_slot(st.slot)
        logits = self.model.compute_logits(hidden[: min(n, sc.max_num_seqs)])
        del hidden
        try:
            self.profile_sampler(logits)
        except Exception as e:  # noqa: BLE001 - the KV cache is then sized without it
            logger.warning("the sampler's worst case could not be profiled (%s: %s); the "
                           "KV cache leaves it only gpu_memory_utilization's headroom",
                           type(e).__name__, e)
        del logits
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device)
        self.kv_caches = []
        torch.cuda.empty_cache()
        return peak

    @torch.inference_mode()
    def profile_sampler(self, logits: torch.Tensor) -> None:
        """The sampler's worst case on ``logits``, inside the KV cache's memory profile
        (``octavo.worker.sampler_profile``)."""
        sample_worst_case(self.sampler, logits, self.config.model_config.max_logprobs)

    def capture_cuda_graphs(self) -> None:
        cfg = self.config
        if self.device.type != "cuda" or cfg.device_config.enforce_eager:
            return
        if self.backend.name != "triton":
            logger.info("CUDA graphs need the triton backend; running eagerly")
            return
        if not getattr(self.model, "cuda_graph_safe", True):
            logger.info("%s is not captured in CUDA graphs yet; running eagerly",
                        type(self.model).__name__)
            return
        max_bs = min(cfg.scheduler_config.max_num_seqs, 512)
        self.graph_runner = CudaGraphRunner(self.model, self.buf, self.kv_caches, max_bs,
                                            cfg.scheduler_config.max_model_len)
        self.graph_runner.capture()

    # ------------------------------------------------------------------ the step
    def _update_states(self, sched: SchedulerOutput) -> None:
        for rid in sched.finished_req_ids:
            self._drop(rid)
            self._seed_gens.pop(rid, None)
        for rid in sched.preempted_req_ids:  # they come back as new requests
            self._drop(rid)
        for new in sched.new_reqs:
            self._drop(new.req_id)
            self.states[new.req_id] = CachedRequestState(
                new.req_id, list(new.token_ids), new.num_prompt_tokens, new.sampling_params,
                list(new.block_ids), new.num_computed_tokens,
                BadWordIndex(new.bad_words_token_ids) if new.bad_words_token_ids else None,
                slot=self.buf.take_slot())
        for c in sched.cached_reqs:
            st = self.states[c.req_id]
            st.block_ids.extend(c.new_block_ids)
            st.num_computed_tokens = c.num_computed_tokens

    def reset(self) -> None:
        """Forget every request (after a step fault the engine starts over): slots, seeded
        generators and the in-flight tokens of asynchronous scheduling."""
        for rid in list(self.states):
            self._drop(rid)
        self._seed_gens.clear()
        self._prev_sampled = None
        self._prev_rows = {}
        self._fix = []
        self._inputs_sent = None
        self._deferred = None
        self._pending = None

    def _drop(self, req_id: str) -> None:
        st = self.states.pop(req_id, None)
        if st is not None:
            self.buf.release_slot(st.slot)
            if st.row_cache.penalty is not None:
                self.penalty_rows.release(st.row_cache.penalty)

    def _append_table(self, st: CachedRequestState) -> None:
        """Write the request's block ids not yet in its row of the persistent table."""
        self.buf.req_tables.np[st.slot, st.table_len: len(st.block_ids)] = (
            st.block_ids[st.table_len:])
        st.table_len = len(st.block_ids)

    def _prepare(self, states: list[CachedRequestState], num_new: list[int],
                 num_computed: list[int]) -> tuple[int, np.ndarray]:
        """Fill the host side of the input buffers; returns (num tokens, query start locs)."""
        buf, bs = self.buf, self.block_size
        b = len(states)
        q_lens = np.asarray(num_new, dtype=np.int64)
        nc = np.asarray(num_computed, dtype=np.int64)
        qsl = buf.query_start_loc.np
        qsl[0] = 0
        np.cumsum(q_lens, out=qsl[1: b + 1])
        t = int(qsl[b])
        buf.seq_lens.np[:b] = nc + q_lens
        table = buf.req_tables.np
        slots = buf.table_slots.np
        ids_np = buf.input_ids.np
        if t == b:  # decode-only: one token per request
            for i, (st, c) in enumerate(zip(states, num_computed)):
                slots[i] = st.slot
                if st.table_len < len(st.block_ids):
                    self._append_table(st)
                if c < len(st.token_ids):
                    ids_np[i] = st.token_ids[c]
                else:  # sampled by the step still in flight
                    self._fix.append((i, self._prev_rows[st.req_id]))
            positions = nc
            row_slots = slots[:b]
        else:
            off = 0
            for i, (st, c, n) in enumerate(zip(states, num_computed, num_new)):
                slots[i] = st.slot
                if st.table_len < len(st.block_ids):
                    self._append_table(st)
                toks = st.token_ids[c: c + n]
                ids_np[off: off + len(toks)] = toks
                if len(toks) < n:  # the last one was sampled by the step still in flight
                    self._fix.append((off + n - 1, self._prev_rows[st.req_id]))
                off += n
            row_slots = np.repeat(slots[:b], q_lens)
            positions = np.arange(t) - np.repeat(qsl[:b], q_lens) + np.repeat(nc, q_lens)
        buf.positions.np[:t] = positions
        buf.slot_mapping.np[:t] = table[row_slots, positions // bs] * bs + positions % bs
        return t, qsl[: b + 1]

    def _eager_metadata(self, b: int, t: int, qsl: np.ndarray) -> AttentionMetadata:
        buf = self.buf
        seq = buf.seq_lens.np[:b]
        q_lens = np.diff(qsl)
        return AttentionMetadata(
            num_tokens=t,
            num_reqs=b,
            query_start_loc=buf.query_start_loc.upload(b + 1),
            seq_lens=buf.seq_lens.upload(b),
            block_tables=buf.gather_block_tables(b),
            slot_mapping=buf.slot_mapping.upload(t),
            max_query_len=int(q_lens.max()),
            max_seq_len=int(seq.max()),
            query_start_loc_cpu=qsl.tolist(),
            seq_lens_cpu=seq.tolist(),
        )

    def _forward(self, states, num_new, num_computed,
                 before_launch=None) -> tuple[torch.Tensor, np.ndarray]:
        """Fill and upload the inputs, then launch the model. ``before_launch(t, qsl)``
        stages more host data (sampling parameters) while the staging buffers are ours."""
        b = len(states)
        t0 = time.perf_counter()
        self._wait_inputs_sent()
        self._fix = []
        self.buf.use_decode_rows(sum(num_new) == b)
        t, qsl = self._prepare(states, num_new, num_computed)
        # The step before's deferred sampling goes first on the device: after this step's
        # host preparation, before its sampling parameters, uploads and in-flight tokens.
        self.flush_pending_sample()
        if before_launch is not None:
            before_launch(t, qsl)
        self.last_prepare_s = time.perf_counter() - t0
        graphs = self.graph_runner
        if graphs is not None and t == b and graphs.padded_size(b) is not None:
            bs = graphs.stage(b)
            self._feed_in_flight_tokens()
            return graphs.replay(bs, b), qsl
        if graphs is not None and t != b and graphs.mixed_size(t) is not None:
            padded = graphs.stage_mixed(t, b)
            self._feed_in_flight_tokens()
            return graphs.replay_mixed(padded, t), qsl
        meta = self._eager_metadata(b, t, qsl)
        ids = self.buf.input_ids.upload(t)
        pos = self.buf.positions.upload(t)
        self._feed_in_flight_tokens()
        return self.model(ids, pos, ForwardContext(meta, self.kv_caches)), qsl

    def _wait_inputs_sent(self) -> None:
        """Wait until the device has read the last step's host staging (its copy is
        asynchronous), before the host rewrites any of it."""
        if self._inputs_sent is not None:
            self._inputs_sent.synchronize()
            self._inputs_sent = None

    def _feed_in_flight_tokens(self) -> None:
        """Send the step's inputs (the last upload: packed, the step's one copy), copy the
        previous step's samples into the input positions that wait for them (on the device,
        in stream order), and mark the staging buffers as sent."""
        buf = self.buf
        if self._fix:
            self.num_tokens_fed_on_device += len(self._fix)
            dst = buf.fix_dst.put([d for d, _ in self._fix])
            src = buf.fix_src.put([r for _, r in self._fix])
        buf.flush()
        if self._fix:
            buf.input_ids.gpu.index_copy_(0, dst, self._prev_sampled.index_select(0, src))
        if self.device.type == "cuda":
            self._inputs_sent = torch.cuda.Event()
            self._inputs_sent.record()

    @torch.inference_mode()
    def execute_model_async(self, sched: SchedulerOutput) -> StepHandle | None:
        """Launch the step; the handle's result() waits for its sampled tokens. Steps must
        be launched in schedule order; a step may be launched before the previous one's
        result() (its in-flight tokens are then read on the device).

        With ``sched.defer_sampling`` only the forward pass (and the logits) is launched and
        None returned: ``sample_tokens`` then samples with the guided rows' bitmask and
        returns the handle, before the next step is launched."""
        sample = self._launch(sched)
        if sched.defer_sampling:
            self._deferred = sample
            return None
        return sample(None)

    @torch.inference_mode()
    def sample_tokens(self, grammar: GrammarBitmask | None) -> StepHandle | PendingSample:
        """Sample the step launched with ``defer_sampling``; ``grammar``: the token bitmask
        of its guided requests that sample (None: none does).

        On CUDA the sampling is enqueued later, once the next step's host preparation is
        done (``PendingSample``): a guided step's sampling waits for its bitmask, so enqueued
        at once it would leave the device idle through the next step's schedule and
        preparation. The rows of its tokens are known now, and the next step's preparation
        reads them."""
        sample, self._deferred = self._deferred, None
        if sample is None:
            raise RuntimeError("sample_tokens() without a step launched with defer_sampling")
        self.flush_pending_sample()
        if not self.defer_guided_sampling or not sample.req_ids:
            return sample(grammar)
        self._prev_rows = {rid: i for i, rid in enumerate(sample.req_ids)}
        self._pending = PendingSample(lambda: sample(grammar))
        return self._pending

    def flush_pending_sample(self) -> None:
        """Enqueue the deferred sampling that waits for the next step, if any."""
        pending, self._pending = self._pending, None
        if pending is not None:
            with torch.inference_mode():
                pending.enqueue()

    def _launch(self, sched: SchedulerOutput) -> _Sample:
        """Run the step up to its logits; returns the function that samples them."""
        if self._deferred is not None:
            raise RuntimeError("a step was launched before the one before it was sampled")
        self.last_prepare_s = 0.0
        # Before _update_states: a new request's slot may be one the last step still read
        # (a request that finished in the step before was in it), and take_slot zeroes its
        # host row, which that step's copy may not have sent yet.
        self._wait_inputs_sent()
        self._update_states(sched)
        if sched.blocks_to_swap_out or sched.blocks_to_swap_in:  # before copies and forward
            self.swap_cache.swap(sched.blocks_to_swap_out, sched.blocks_to_swap_in)
        if sched.block_copies:
            self._copy_blocks(sched.block_copies)
        if sched.is_empty:
            return _Sample(lambda _: StepHandle.done(ModelRunnerOutput([], [])), [])
        req_ids = list(sched.num_scheduled_tokens)
        states = [self.states[r] for r in req_ids]
        num_new = [sched.num_scheduled_tokens[r] for r in req_ids]
        num_computed = [st.num_computed_tokens for st in states]
        # Requests whose tokens are all computed after this step produce a token (the last
        # one may itself be in flight).
        rows = [i for i, (st, nc, n) in enumerate(zip(states, num_computed, num_new))
                if nc + n >= len(st.token_ids)]
        sample_states = [states[i] for i in rows]
        staged: dict = {}

        def before_launch(t: int, qsl: np.ndarray) -> None:
            if not rows:
                return
            ends = [num_computed[i] + num_new[i] for i in rows]
            staged["meta"] = self._sampling_metadata(sample_states, ends)
            if len(rows) != t:
                staged["idx"] = self.buf.logits_indices.put(qsl[1:][rows] - 1)

        hidden, qsl = self._forward(states, num_new, num_computed, before_launch)
        prepare_s = self.last_prepare_s
        prompt_lp = logprobs.prompt_logprobs(
            self.model, self.config.model_config.hf_config.vocab_size, states, num_new,
            num_computed, hidden, qsl)
        if not rows:
            if prompt_lp is None:
                return _Sample(lambda _: StepHandle.done(
                    ModelRunnerOutput([], [], prepare_s=prepare_s)), [])
            ready = None
            if self.device.type == "cuda":  # after the prompt logprobs' copies to the host
                ready = torch.cuda.Event()
                ready.record()
            return _Sample(lambda _: StepHandle(lambda _tokens: ModelRunnerOutput(
                [], [], prompt_logprobs=logprobs.resolve_prompt_logprobs(prompt_lp),
                prepare_s=prepare_s), None, ready), [])
        last_hidden = hidden[staged["idx"]] if "idx" in staged else hidden
        logits = self.model.compute_logits(last_hidden)
        meta = staged["meta"]
        return _Sample(lambda grammar: self._sample(logits, meta, grammar, sample_states,
                                                    prompt_lp, prepare_s),
                       [st.req_id for st in sample_states])

    def _sample(self, logits: torch.Tensor, meta: SamplingMetadata,
                grammar: GrammarBitmask | None, sample_states: list[CachedRequestState],
                prompt_lp, prepare_s: float) -> StepHandle:
        if grammar is not None:
            meta.grammar = self._grammar_mask(sample_states, grammar)
        out = self.sampler(logits, meta)
        self._prev_sampled = out.sampled
        self._prev_rows = {st.req_id: i for i, st in enumerate(sample_states)}
        ready = None
        if self._sampled_host:
            host = self._sampled_host[self._flip][: len(sample_states)]
            self._flip ^= 1
            host.copy_(out.sampled, non_blocking=True)
            logprobs.sampled_to_host(out)  # read back with the tokens
            ready = torch.cuda.Event()
            ready.record()
        else:
            host = out.sampled

        def finish(tokens: list[int]) -> ModelRunnerOutput:
            for st, tok in zip(sample_states, tokens):
                if self.states.get(st.req_id) is st:  # not finished / preempted meanwhile
                    st.token_ids.append(tok)
            return ModelRunnerOutput(
                req_ids=[st.req_id for st in sample_states],
                sampled_token_ids=tokens,
                logprobs=logprobs.sampled_logprobs(sample_states, out),
                prompt_logprobs=logprobs.resolve_prompt_logprobs(prompt_lp),
                failed=({sample_states[r].req_id: f"{type(e).__name__}: {e}"
                         for r, e in out.failed_rows.items()} if out.failed_rows else None),
                prepare_s=prepare_s,
            )

        return StepHandle(finish, host, ready)

    def _copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy whole KV blocks (every layer); dim 1 is the block dim in every backend's
        layout."""
        src = to_device([s for s, _ in copies], self.device, torch.long)
        dst = to_device([d for _, d in copies], self.device, torch.long)
        for cache in self.kv_caches:
            if cache.element_size() == 1:  # float8 blocks: copied as bytes
                cache = cache.view(torch.uint8)
            cache[:, dst] = cache[:, src]

    def _sampling_metadata(self, states: list[CachedRequestState],
                           ends: list[int]) -> SamplingMetadata:
        """``ends``: each row's token count once this step is computed; the token sampled
        now is output number ``end - num_prompt_tokens`` (counting from 0). The guided
        rows' mask is set at sampling time (``_sample``)."""
        params = [st.sampling_params for st in states]
        types = [p.sampling_type for p in params]
        want_lp = [p.logprobs for p in params if p.logprobs is not None]
        max_lp = None
        if want_lp:
            vocab = self.config.model_config.hf_config.vocab_size
            max_lp = max(vocab if k == -1 else k for k in want_lp)
        contexts = []
        for row, (st, end) in enumerate(zip(states, ends)):
            p = st.sampling_params
            banned = None
            if end - st.num_prompt_tokens < p.min_tokens:
                ids = set(p.stop_token_ids or ())
                if not p.ignore_eos:
                    ids.update(self.config.model_config.eos_token_ids)
                banned = sorted(ids) or None
            if banned or needs_processing(p):
                n = st.num_prompt_tokens
                contexts.append(RowContext.over(row, p, st.token_ids, n,
                                                st.bad_words_token_ids, banned, st.row_cache))
        if all(t == SamplingType.GREEDY for t in types):
            return SamplingMetadata(True, None, None, None, None, {}, max_lp, contexts,
                                    penalties=self.penalty_rows)
        dev = self.device
        buf = self.buf
        temp = buf.temperature.put([0.0 if t == SamplingType.GREEDY else p.temperature
                                    for p, t in zip(params, types)])
        vocab = self.config.model_config.hf_config.vocab_size
        top_k = top_p = min_p = None
        if any(p.top_k_enabled for p in params):
            top_k = buf.top_k.put([p.top_k if p.top_k_enabled else vocab for p in params])
        if any(p.top_p < 1.0 for p in params):
            top_p = buf.top_p.put([p.top_p for p in params])
        if any(p.min_p > 0.0 for p in params):
            min_p = buf.min_p.put([p.min_p for p in params])
        gens = {}
        for row, (st, t, end) in enumerate(zip(states, types, ends)):
            if t == SamplingType.RANDOM_SEED:
                gen = self._seed_gens.get(st.req_id)
                if gen is None:
                    gen = self._seed_gens[st.req_id] = torch.Generator(device=dev)
                # Reseeded per output position: the same tokens whatever the batch, and
                # after a preemption too.
                seed = st.sampling_params.seed * _SEED_STRIDE + end - st.num_prompt_tokens
                gen.manual_seed(seed % (2 ** 63))
                gens[row] = gen
        return SamplingMetadata(False, temp, top_k, top_p, min_p, gens, max_lp, contexts,
                                self.generator, penalties=self.penalty_rows)

    def _grammar_mask(self, states: list[CachedRequestState],
                      grammar: GrammarBitmask) -> GrammarMask | None:
        """The bitmask rows of the guided requests among this step's sampling rows, on the
        device, with the logits rows they constrain."""
        index = {rid: i for i, rid in enumerate(grammar.req_ids)}
        rows = [r for r, st in enumerate(states) if st.req_id in index]
        if not rows:
            return None
        src = [index[states[r].req_id] for r in rows]
        bitmask = grammar.bitmask
        if src != list(range(bitmask.shape[0])):
            bitmask = bitmask[torch.tensor(src)]
        bitmask = to_device(bitmask, self.device)
        if rows == list(range(len(rows))):
            return GrammarMask(bitmask, None)
        return GrammarMask(bitmask, to_device(rows, self.device, torch.long))
