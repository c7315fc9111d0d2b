"""Structured outputs: constrain a request's tokens to a JSON schema, a regex, a choice or a
grammar.

``params`` (torch-free) says what a request asks for; ``manager`` compiles it through a
backend from ``backend``'s registry (xgrammar by default), caches the compiled grammar, keeps a
matcher per request and fills the token bitmask each step; the sampler applies the bitmask
(``octavo.sample.bitmask``). Only ``params`` is imported here: the rest needs torch and the
grammar library, imported when a constrained request arrives.
"""

from __future__ import annotations

from octavo.structured_output.params import GuidedDecodingParams, StructuredOutputsParams

__all__ = ["GuidedDecodingParams", "StructuredOutputsParams"]
