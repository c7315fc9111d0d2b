"""Turns last-position logits into tokens: greedy, temperature, top-k, top-p, min-p, seeds.

Random rows use the exponential-race trick: argmax(p / q) with q ~ Exp(1) draws from p. A seeded
row draws its q from its own generator, so its tokens do not depend on the rest of the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from octavo import envs
from octavo.kernels.triton_available import HAS_TRITON
from octavo.sample.grammar_mask import apply_token_bitmask
from octavo.sample.logits_processors import apply_logits_processors
from octavo.sample.metadata import SamplingMetadata
from octavo.sample.upload import to_device


def argmax(x: torch.Tensor) -> torch.Tensor:
    """``x.argmax(dim=-1)`` of [rows, vocab]; float32 CPU rows through the C++ kernel (torch's
    CPU argmax walks each row with a scalar loop: 1.3 ms of a ~70 ms W6 decode step at 32 rows
    on one core, the kernel ~0.1 ms; same indices, first maximum or first NaN)."""
    if (x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 2
            and x.shape[1] > 0 and x.stride(1) == 1):
        from octavo.kernels import cpu as cpu_kernels

        ops = cpu_kernels.ops_for(x)
        if ops is not None and hasattr(ops, "argmax_rows"):
            return ops.argmax_rows(x)
    return x.argmax(dim=-1)


@dataclass
class SamplerOutput:
    sampled: torch.Tensor  # [B] int64
    # When logprobs were requested: logprob and rank of the sampled token, and the top-k.
    sampled_logprobs: torch.Tensor | None = None
    sampled_ranks: torch.Tensor | None = None
    topk_ids: torch.Tensor | None = None
    topk_logprobs: torch.Tensor | None = None
    # Rows whose logits processing raised (their request is ended with the error).
    failed_rows: dict[int, BaseException] | None = None


class Sampler:
    def __call__(self, logits: torch.Tensor, meta: SamplingMetadata) -> SamplerOutput:
        if not meta.row_contexts and meta.grammar is None and (
                meta.max_num_logprobs is None or stats_kernel(logits)):
            # One pass over the raw logits for the draw (and one for the logprobs), no
            # float32 copy.
            sampled = None
            if self._races(logits, meta):
                sampled = self._race(logits, meta)
            elif meta.all_greedy and meta.max_num_logprobs is not None:
                sampled = logits.argmax(dim=-1)  # a float copy's argmax, the same index
            if sampled is not None:
                out = SamplerOutput(sampled=sampled)
                if meta.max_num_logprobs is not None:
                    self._logprobs(logits, sampled, meta.max_num_logprobs, out)
                return out
        logits = logits.float()
        if meta.grammar is not None:
            # Before everything else, as vLLM: logprobs are those of the constrained
            # distribution, and penalties / biases never revive a disallowed token.
            logits = apply_token_bitmask(logits, meta.grammar)
        raw = logits
        failed: dict[int, BaseException] = {}
        if meta.row_contexts:
            # In place unless logprobs (of the raw distribution) are wanted: a step's logits
            # are its own (not read after sampling), and a copy of a batch's (256 x 152k
            # float32) took ~75 ms on the CPU.
            keep_raw = meta.max_num_logprobs is not None
            logits = apply_logits_processors(logits.clone() if keep_raw else logits,
                                             meta.row_contexts, failed, meta.penalties)
        if meta.all_greedy:
            sampled = argmax(logits)
        elif self._races(logits, meta):  # the processed logits, in the same one pass
            sampled = self._race(logits, meta)
        else:
            sampled = self._sample(logits, meta)
        if meta.row_contexts and meta.penalties is not None:
            meta.penalties.count_sampled(sampled)  # the next step's penalties include them
        out = SamplerOutput(sampled=sampled, failed_rows=failed or None)
        if meta.max_num_logprobs is not None:
            self._logprobs(raw, sampled, meta.max_num_logprobs, out)
        return out

    @staticmethod
    def _races(logits: torch.Tensor, meta: SamplingMetadata) -> bool:
        """Whether the draw runs as one kernel on CUDA (octavo/kernels/sample_race.py):
        temperature and greedy rows only, no top-k / top-p / min-p (those need the sorted
        distribution). Penalties, biases, bans and grammar masks are applied to the logits
        before it; logprobs are read from the raw logits beside it."""
        return (logits.is_cuda and HAS_TRITON and not meta.all_greedy
                and meta.top_k is None and meta.top_p is None and meta.min_p is None
                and envs.sample_kernel())

    @staticmethod
    def _race(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        # The step's base seed is drawn on the device from the engine's generator: no host
        # round trip, so asynchronous scheduling keeps overlapping. Seeded rows bring their
        # own per-position seed (set by the model runner), copied from pinned memory.
        base = torch.randint(0, 2**62, (1,), device=logits.device, generator=meta.generator)
        row_seeds = None
        if meta.generators:
            seeds = [-1] * logits.shape[0]
            for row, gen in meta.generators.items():
                seeds[row] = gen.initial_seed()
            row_seeds = to_device(seeds, logits.device, torch.int64)
        from octavo.kernels.sample_race import race_sample  # Triton: imported on CUDA only

        return race_sample(logits, meta.temperature, base, row_seeds)

    def _sample(self, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        greedy_tokens = argmax(logits)
        temp = meta.temperature
        greedy_rows = temp < 1e-5
        logits = logits / torch.where(greedy_rows, torch.ones_like(temp), temp).unsqueeze(1)
        if meta.top_k is not None or meta.top_p is not None:
            logits = apply_top_k_top_p(logits, meta.top_k, meta.top_p)
        probs = torch.softmax(logits, dim=-1)
        if meta.min_p is not None:
            top = probs.max(dim=-1, keepdim=True).values
            probs = probs.masked_fill(probs < meta.min_p.unsqueeze(1) * top, 0.0)
        q = torch.empty_like(probs)
        if len(meta.generators) < probs.shape[0]:
            q.exponential_(generator=meta.generator)
        for row, gen in meta.generators.items():
            q[row].exponential_(generator=gen)
        sampled = argmax(probs.div_(q))
        return torch.where(greedy_rows, greedy_tokens, sampled)

    def _logprobs(self, raw: torch.Tensor, sampled: torch.Tensor, k: int,
                  out: SamplerOutput) -> None:
        (out.sampled_logprobs, out.sampled_ranks, out.topk_ids,
         out.topk_logprobs) = token_logprobs(raw, sampled, min(k, raw.shape[-1]))


def stats_kernel(logits: torch.Tensor) -> bool:
    """Whether logprobs come from octavo/kernels/logprob_stats.py (CUDA): one pass over the
    logits in their own dtype, no [B, V] float32 log-softmax."""
    return logits.is_cuda and HAS_TRITON and envs.logprob_kernel()


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, k: int):
    """Each row's logprob of ``tokens`` [B] under log-softmax(``logits`` [B, V]), its rank
    (1 + the logits above it) and, for ``k`` > 0, the row's top k ids and logprobs (else
    None, None): float32 logprobs, int64 ranks and ids. The sampled tokens' and the prompt's
    (octavo/worker/logprobs.py) alike."""
    if stats_kernel(logits) and logits.stride(-1) == 1:
        from octavo.kernels.logprob_stats import logprob_stats  # Triton: CUDA only

        log_z, token_lp, ranks = logprob_stats(logits, tokens)
        if k <= 0:
            return token_lp, ranks, None, None
        vals, ids = logits.topk(k, dim=-1)  # log-softmax is monotonic: the logits' top k
        return token_lp, ranks, ids, vals.float() - log_z.unsqueeze(1)
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    token_lp = logprobs.gather(1, tokens.unsqueeze(1)).squeeze(1)
    ranks = (logprobs > token_lp.unsqueeze(1)).sum(dim=-1) + 1
    if k <= 0:
        return token_lp, ranks, None, None
    vals, ids = logprobs.topk(k, dim=-1)
    return token_lp, ranks, ids, vals


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None,
                      top_p: torch.Tensor | None) -> torch.Tensor:
    """Mask logits outside each row's top-k and nucleus (top-p) to -inf."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    if top_k is not None:
        ranks = torch.arange(vocab, device=logits.device).unsqueeze(0)
        sorted_logits = sorted_logits.masked_fill(ranks >= top_k.unsqueeze(1), float("-inf"))
    if top_p is not None:
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token when the mass strictly before it already reaches top_p.
        before = probs.cumsum(dim=-1) - probs
        drop = before >= top_p.unsqueeze(1)
        drop[:, 0] = False
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter_(1, order, sorted_logits)
