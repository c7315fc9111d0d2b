"""The offline API: ``LLM(model=...).generate(prompts, sampling_params)``, as in vLLM."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from octavo.engine.arg_utils import EngineArgs
from octavo.engine.llm_engine import LLMEngine
from octavo.engine.processor import PromptType
from octavo.entrypoints.chat_utils import Conversation, apply_chat_template
from octavo.outputs import RequestOutput
from octavo.sampling_params import RequestOutputKind, SamplingParams


class LLM:
    """An engine for offline batched generation.

    Accepts vLLM's constructor arguments (model, tokenizer, dtype, seed, max_model_len,
    max_num_seqs, max_num_batched_tokens, block_size, gpu_memory_utilization, swap_space,
    enforce_eager, quantization, tensor_parallel_size, ...). ``model=None`` runs the embedded
    default, SmolLM2-135M-Instruct.
    """

    def __init__(self, model: str | None = None, tokenizer: str | None = None,
                 dtype: str = "auto", seed: int = 0, **kwargs: Any) -> None:
        unknown = set(kwargs) - EngineArgs.field_names()
        if unknown:
            raise ValueError(f"unknown LLM arguments: {sorted(unknown)}")
        args = EngineArgs(model=model, tokenizer=tokenizer, dtype=dtype, seed=seed, **kwargs)
        self.llm_engine = LLMEngine.from_engine_args(args)

    def get_tokenizer(self):
        return self.llm_engine.get_tokenizer()

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        priority: list[int] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt; returns one finished RequestOutput per prompt, in order."""
        if isinstance(prompts, str | dict) or (
                isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"got {len(params)} sampling_params for {len(prompts)} prompts")
        if priority is not None and len(priority) != len(prompts):
            raise ValueError(f"got {len(priority)} priorities for {len(prompts)} prompts")
        engine = self.llm_engine
        # Validate everything before queueing anything, so a bad prompt leaves no orphans.
        for i, (p, sp) in enumerate(zip(prompts, params)):
            try:
                engine.processor.process("validate", p, sp)
            except ValueError as e:
                raise ValueError(f"prompt {i}: {e}") from None
        ids = []
        try:
            for i, (p, sp) in enumerate(zip(prompts, params)):
                rid = engine.next_request_id()
                if sp.output_kind != RequestOutputKind.FINAL_ONLY:
                    sp = sp.clone()
                    sp.output_kind = RequestOutputKind.FINAL_ONLY
                engine.add_request(rid, p, sp, priority=priority[i] if priority else 0)
                ids.append(rid)
            return self._run(ids, use_tqdm)
        except BaseException:
            engine.abort_request(ids)
            raise

    def chat(
        self,
        messages: Conversation | Sequence[Conversation],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
    ) -> list[RequestOutput]:
        """Generate replies to one conversation or a list of conversations (lists of
        {"role", "content"} dicts), formatted with the model's chat template."""
        if messages and isinstance(messages[0], Mapping):
            messages = [messages]  # type: ignore[list-item]
        tokenizer = self.get_tokenizer()
        template = chat_template or self.llm_engine.config.model_config.chat_template
        prompts = [apply_chat_template(tokenizer, conv, template, add_generation_prompt)
                   for conv in messages]
        # The template already holds the BOS/special tokens: do not add them again.
        ids = [{"prompt": p, "prompt_token_ids": tokenizer.encode(p, add_special_tokens=False)}
               for p in prompts]
        return self.generate(ids, sampling_params, use_tqdm=use_tqdm)

    def _run(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        engine = self.llm_engine
        order = {rid: i for i, rid in enumerate(ids)}
        results: list[RequestOutput | None] = [None] * len(ids)
        bar = None
        if use_tqdm:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(ids), desc="Processed prompts", dynamic_ncols=True,
                       postfix="est. speed input: 0.00 toks/s, output: 0.00 toks/s")
        t0 = time.perf_counter()
        in_toks = out_toks = 0
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished and out.request_id in order:
                    results[order[out.request_id]] = out
                    if bar is not None:
                        in_toks += len(out.prompt_token_ids)
                        out_toks += sum(len(c.token_ids) for c in out.outputs)
                        dt = time.perf_counter() - t0
                        bar.postfix = (f"est. speed input: {in_toks / dt:.2f} toks/s, "
                                       f"output: {out_toks / dt:.2f} toks/s")
                        bar.update(1)
        if bar is not None:
            bar.close()
        missing = [ids[i] for i, r in enumerate(results) if r is None]
        if missing:
            raise RuntimeError(f"requests {missing} ended without a final output")
        return results  # type: ignore[return-value]
