"""The model chat templates committed in ``tito_assets/templates/``: where each file came from.

trl ships the templates of a dozen families; the families trl lacks (Kimi K2, MiniMax, Mistral,
Seed-OSS, Llama 4, Granite, the pythonic and JSON-list formats, ...) are taken from the two public
collections of real model templates, byte for byte (line endings normalized to ``\\n``, which Jinja
does on load anyway):

- llama.cpp's ``models/templates/`` (each file is the model repository's own template, fetched by
  ``scripts/get_chat_template.py``); copied from the llama.cpp tree that PyPI's ``llama-cpp-python``
  0.3.36 source distribution vendors (``vendor/llama.cpp/models/templates/``);
- vLLM's ``examples/tool_chat_template_*.jinja`` (tool-calling templates vLLM documents per parser).

The template's name here is the file's stem; docs/families.md shows each one's source and verdict.
No model hub is touched: the templates are files of this repository.
"""

from __future__ import annotations

from pathlib import Path

TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"

_LLAMA_CPP = "ggml-org/llama.cpp models/templates/"
_VLLM = "vllm-project/vllm examples/"

# template name -> where the file came from (repository, path and, for vLLM, the commit read).
MODEL_TEMPLATES: dict[str, str] = {
    "apertus": _LLAMA_CPP + "Apertus-8B-Instruct.jinja",
    "devstral_small": _LLAMA_CPP + "unsloth-mistral-Devstral-Small-2507.jinja",
    "gemma3_pythonic": _VLLM + "tool_chat_template_gemma3_pythonic.jinja @c6991a3",
    "granite_3_3": _LLAMA_CPP + "ibm-granite-granite-3.3-2B-Instruct.jinja",
    "granite_4_0": _LLAMA_CPP + "ibm-granite-granite-4.0.jinja",
    "hermes_2_pro": _LLAMA_CPP + "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja",
    "internlm2": _VLLM + "tool_chat_template_internlm2_tool.jinja @87b6352",
    "kimi_k2": _LLAMA_CPP + "moonshotai-Kimi-K2.jinja",
    "kimi_k2_instruct": _LLAMA_CPP + "Kimi-K2-Instruct.jinja",
    "kimi_k2_thinking": _LLAMA_CPP + "Kimi-K2-Thinking.jinja",
    "llama3_2_pythonic": _VLLM + "tool_chat_template_llama3.2_pythonic.jinja @3a9445d",
    "llama4_json": _VLLM + "tool_chat_template_llama4_json.jinja @97ce423",
    "llama4_pythonic": _VLLM + "tool_chat_template_llama4_pythonic.jinja @0471aed",
    "minimax_m1": _LLAMA_CPP + "MiniMax-M1.jinja",
    "minimax_m2": _LLAMA_CPP + "MiniMax-M2.jinja",
    "ministral_3": _LLAMA_CPP + "mistralai-Ministral-3-14B-Reasoning-2512.jinja",
    "mistral_nemo": _LLAMA_CPP + "mistralai-Mistral-Nemo-Instruct-2407.jinja",
    "mistral_small_3_2": _LLAMA_CPP + "Mistral-Small-3.2-24B-Instruct-2506.jinja",
    "nemotron_json": _VLLM + "tool_chat_template_nemotron_json.jinja @4b6abc6",
    "nemotron_nano_v2": _LLAMA_CPP + "NVIDIA-Nemotron-Nano-v2.jinja",
    "olmo3": _VLLM + "tool_chat_template_olmo3.jinja @2e30b47",
    "phi4_mini": _VLLM + "tool_chat_template_phi4_mini.jinja @07b1349",
    "qwen2_5_coder": _VLLM + "tool_chat_template_qwen2_5_coder.jinja @b2a3833",
    "qwen3_coder": _LLAMA_CPP + "Qwen3-Coder.jinja",
    "seed_oss": _LLAMA_CPP + "ByteDance-Seed-OSS.jinja",
    "toolace": _VLLM + "tool_chat_template_toolace.jinja @d8aae51",
    "xlam_qwen": _VLLM + "tool_chat_template_xlam_qwen.jinja @31106f4",
}


def model_template_path(name: str) -> Path:
    return TEMPLATES_DIR / f"{name}.jinja"


def template_source(name: str) -> str:
    """Where template ``name`` came from: a committed file's source, else trl's folder."""
    return MODEL_TEMPLATES.get(name) or f"trl 1.16 chat_templates/{name}.jinja"
