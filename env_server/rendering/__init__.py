"""Rendering layer: tokenizer registry, prompt/suffix ids under the model's chat template, tool-call parsing."""

from tito.fingerprint import RENDERER_VERSION

from .context import RenderingContext, truncation_marker
from .errors import InvalidTokenizerFilesError, RenderingError, SuffixRenderError, UnsupportedTemplateError
from .families import FamilyRules, detect_family
from .registry import TokenizerRegistry
from .types import ParsedCompletion, SuffixResult

__all__ = [
    "RENDERER_VERSION",
    "FamilyRules",
    "InvalidTokenizerFilesError",
    "ParsedCompletion",
    "RenderingContext",
    "RenderingError",
    "SuffixRenderError",
    "SuffixResult",
    "TokenizerRegistry",
    "UnsupportedTemplateError",
    "detect_family",
    "truncation_marker",
]
