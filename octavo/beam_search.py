"""Public outputs of `LLM.beam_search` (vLLM's `vllm.beam_search` names). Pure Python."""

from __future__ import annotations

from dataclasses import dataclass, field

from octavo.outputs import Logprob


@dataclass
class BeamSearchSequence:
    """One finished beam.

    tokens: the prompt's token ids followed by the generated ones (the EOS that ended the
    beam included), as in vLLM. logprobs: one dict per generated token, the candidates
    considered at that step (token id -> Logprob). cum_logprob: sum of the generated tokens'
    logprobs. score: the length-penalised score the beam was ranked by,
    ``cum_logprob / num_generated_tokens ** length_penalty`` (Hugging Face's definition).
    text: the generated text (without the prompt, without the ending EOS).
    """

    tokens: list[int]
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    score: float = 0.0
    num_prompt_tokens: int = 0

    @property
    def output_token_ids(self) -> list[int]:
        """The generated tokens only."""
        return self.tokens[self.num_prompt_tokens:]


@dataclass
class BeamSearchOutput:
    """The result for one prompt: its best beams, best first (``beam_width`` of them)."""

    sequences: list[BeamSearchSequence]
