"""Errors of the rendering layer. Messages say what was wrong and what to do about it."""

from __future__ import annotations


class RenderingError(Exception):
    """Base class of rendering errors."""


class InvalidTokenizerFilesError(RenderingError, ValueError):
    """The uploaded tokenizer files cannot be loaded (missing, not JSON, not a tokenizer)."""


class UploadTooLargeError(InvalidTokenizerFilesError):
    """The uploaded tokenizer files exceed the server's max_tokenizer_bytes (RESOURCE_EXHAUSTED)."""


class UnsupportedTemplateError(RenderingError):
    """The chat template cannot be rendered token-exactly by this renderer.

    Raised at registration (RegisterTokenizer answers FAILED_PRECONDITION with the message).
    """


class SuffixRenderError(RenderingError):
    """A suffix could not be rendered exactly (e.g. the template rewrote earlier turns).

    Raised loudly rather than returning ids the trainer would append and train on.
    """
