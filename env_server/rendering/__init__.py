"""Rendering layer: tokenizer registry, prompt/suffix ids under the model's chat template, tool-call parsing."""

from tito.fingerprint import RENDERER_VERSION

from .budget import truncation_marker
from .context import RenderingContext
from .errors import (
    InvalidTokenizerFilesError,
    RenderingError,
    SuffixRenderError,
    UnsupportedTemplateError,
    UploadTooLargeError,
)
from .families import FamilyRules, MessageStyle
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
    "UploadTooLargeError",
    "MessageStyle",
    "truncation_marker",
]
