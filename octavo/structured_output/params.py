"""What a request constrains its output to: a JSON schema, a regex, a choice, a grammar or any
JSON object (vLLM's ``StructuredOutputsParams``, and its older name ``GuidedDecodingParams``).

Pure Python on purpose, like ``octavo.sampling_params``: validation happens at construction,
before any grammar library is imported, and errors are ``InvalidRequestError``s naming the
field. Compiling the constraint (and finding it malformed) is the engine's processor's job.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from octavo.errors import InvalidRequestError, check_text
from octavo.errors import short_repr as _short

# The constraint kinds, exactly one of which a request sets.
KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


@dataclass(eq=True)
class StructuredOutputsParams:
    """One output constraint. Set exactly one of ``json`` (a JSON schema: dict, JSON text or a
    pydantic model class), ``regex``, ``choice`` (list of strings), ``grammar`` (EBNF / GBNF,
    or Lark), ``json_object=True`` (any JSON object) or ``structural_tag`` (xgrammar's JSON).

    ``disable_any_whitespace`` makes JSON compact (no free whitespace between tokens: small
    models otherwise tend to pad with newlines); ``disable_additional_properties`` forbids
    properties a schema does not list (xgrammar does by default in strict mode).
    ``backend`` picks a registered backend for this request (default: the engine's).
    """

    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None
    backend: str | None = None
    disable_fallback: bool = False
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None

    # The field name errors report (a subclass or a server may rename it).
    _field_prefix = "structured_outputs"

    def __post_init__(self) -> None:
        self._verify()

    def _name(self, field: str) -> str:
        return f"{self._field_prefix}.{field}"

    def _verify(self) -> None:
        p = self._name
        if self.json is not None:
            self.json = self._schema(self.json)
        if self.regex is not None:
            if not isinstance(self.regex, str) or not self.regex:
                raise InvalidRequestError(p("regex"), f"{p('regex')} must be a non-empty "
                                          f"string, got {_short(self.regex)}")
            check_text(p("regex"), self.regex)
        if self.choice is not None:
            value = self.choice
            if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
                raise InvalidRequestError(p("choice"), f"{p('choice')} must be a list of "
                                          f"strings, got {_short(value)}")
            value = list(value)
            if not value:
                raise InvalidRequestError(p("choice"), f"{p('choice')} must not be empty")
            for c in value:
                if not isinstance(c, str) or not c:
                    raise InvalidRequestError(p("choice"), f"{p('choice')} must hold "
                                              f"non-empty strings, got {_short(c)}")
                check_text(p("choice"), c)
            self.choice = value
        for name in ("grammar", "structural_tag"):
            value = getattr(self, name)
            if value is None:
                continue
            if name == "structural_tag" and isinstance(value, Mapping):
                value = self.structural_tag = json.dumps(value)
            if not isinstance(value, str) or not value.strip():
                raise InvalidRequestError(p(name), f"{p(name)} must be a non-empty string, "
                                          f"got {_short(value)}")
            check_text(p(name), value)
        if self.json_object is not None and not isinstance(self.json_object, bool):
            raise InvalidRequestError(p("json_object"), f"{p('json_object')} must be a bool, "
                                      f"got {_short(self.json_object)}")
        for name in ("disable_fallback", "disable_any_whitespace",
                     "disable_additional_properties"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidRequestError(p(name), f"{p(name)} must be a bool, got "
                                          f"{_short(getattr(self, name))}")
        for name in ("backend", "whitespace_pattern"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise InvalidRequestError(p(name), f"{p(name)} must be a string, got "
                                          f"{_short(value)}")
        if self.whitespace_pattern is not None:
            # xgrammar (the one backend) has no such knob; ignoring it would change output.
            raise InvalidRequestError(p("whitespace_pattern"), f"{p('whitespace_pattern')} is "
                                      "not supported (use disable_any_whitespace=True)")
        kinds = self.kinds
        if len(kinds) != 1:
            got = ", ".join(kinds) if kinds else "none"
            raise InvalidRequestError(
                self._field_prefix, f"{self._field_prefix} must set exactly one of json, "
                f"regex, choice, grammar, json_object or structural_tag; got {got}")

    def _schema(self, value: Any) -> dict | bool:
        """A JSON schema as a dict (or a boolean schema): parsed from text, taken from a
        pydantic model class, or copied from a mapping."""
        name = self._name("json")
        if hasattr(value, "model_json_schema") and callable(value.model_json_schema):
            value = value.model_json_schema()
        if isinstance(value, str):
            check_text(name, value)
            try:
                value = json.loads(value)
            except ValueError as e:
                raise InvalidRequestError(name, f"{name} is not valid JSON: {e}") from None
        if isinstance(value, Mapping):
            try:  # a copy that is plain JSON (the cache key and the compiler need that)
                return json.loads(json.dumps(value))
            except (TypeError, ValueError) as e:
                raise InvalidRequestError(name, f"{name} must be a JSON schema made of JSON "
                                          f"values: {e}") from None
        if isinstance(value, bool):
            return value
        raise InvalidRequestError(name, f"{name} must be a JSON schema (an object, JSON text "
                                  f"or a pydantic model), got {_short(value)}")

    # ------------------------------------------------------------------ derived
    @property
    def kinds(self) -> list[str]:
        """The constraint kinds this request sets (exactly one once validated)."""
        out = []
        for kind in KINDS:
            value = getattr(self, kind)
            if kind == "json_object":
                if value:
                    out.append(kind)
            elif value is not None:
                out.append(kind)
        return out

    @property
    def kind(self) -> str:
        return self.kinds[0]

    @property
    def spec(self) -> Any:
        """The constraint itself (the schema, the regex, the choices ...)."""
        return getattr(self, self.kind)

    def cache_key(self) -> tuple:
        """Identifies the compiled grammar: two requests with equal keys share it."""
        spec = self.spec
        text = spec if isinstance(spec, str) else json.dumps(spec, sort_keys=True)
        return (self.kind, text, self.disable_any_whitespace,
                self.disable_additional_properties)

    @classmethod
    def from_optional(cls, **kwargs: Any) -> StructuredOutputsParams | None:
        """None when no constraint is given (vLLM's helper for its servers)."""
        if all(kwargs.get(k) in (None, False) for k in KINDS):
            return None
        return cls(**kwargs)

    def __repr__(self) -> str:
        parts = [f"{f.name}={_short(getattr(self, f.name), 200)}" for f in fields(self)
                 if getattr(self, f.name) not in (None, False)]
        return f"{type(self).__name__}({', '.join(parts)})"


@dataclass(eq=True, repr=False)
class GuidedDecodingParams(StructuredOutputsParams):
    """vLLM's older name for StructuredOutputsParams (``SamplingParams(guided_decoding=...)``)."""

    _field_prefix = "guided_decoding"


def as_structured_outputs(name: str, value: Any) -> StructuredOutputsParams:
    """A SamplingParams field's value as params: an instance, or a dict of its fields."""
    if isinstance(value, StructuredOutputsParams):
        return value
    if isinstance(value, Mapping):
        cls = GuidedDecodingParams if name == "guided_decoding" else StructuredOutputsParams
        known = {f.name for f in fields(cls)}
        unknown = sorted(str(k) for k in value if k not in known)
        if unknown:
            raise InvalidRequestError(name, f"{name} has unknown fields {unknown}")
        return cls(**value)
    raise InvalidRequestError(name, f"{name} must be StructuredOutputsParams (or a dict of its "
                              f"fields), got {_short(value)}")
