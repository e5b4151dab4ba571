"""Output formats as a registry: each format is one module here declaring its recipe model, the
encoders and roles it needs, its sample maker, its sink, its layout (from ``formats/``) and the
loader preset that reads it. ``build`` looks an output up by its ``format`` name
(:func:`kind_of`); nothing outside this package chooses by the output's type."""

from shardsmith.outputs.base import OutputContext, OutputKind
from shardsmith.outputs.registry import REGISTRY, kind_of, needs_encoders

__all__ = ["OutputContext", "OutputKind", "REGISTRY", "kind_of", "needs_encoders"]
