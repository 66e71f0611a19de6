"""Model families: mlx-lm's, plus the few nightshift defines itself (one module each, mlx-lm style).

`get_classes(config)` is what every loader passes to mlx-lm, so a nightshift family
(e.g. a MoEfied llama) loads exactly like an mlx-lm one.
"""

from __future__ import annotations

import importlib

from mlx_lm.utils import _get_classes as mlx_lm_classes
from transformers import AutoConfig, LlamaConfig

# config["model_type"] -> module in this package.
FAMILIES: dict[str, str] = {"llama_moe": "llama_moe", "kimi_k3_replay": "kimi_k3_replay"}


class LlamaMoeConfig(LlamaConfig):
    """transformers' view of a llama_moe checkpoint: a llama (which is all its tokenizer needs to know)."""

    model_type = "llama_moe"


# mlx-lm loads every tokenizer through transformers' AutoTokenizer, which first reads config.json for
# its model type; one transformers does not know makes it fall back to a bare config and warn every user
# that `llama_moe` may not fit. Known, it needs no fallback, and the tokenizer is the same one.
# Registered on import: engine/runtime.py, which loads models and their tokenizers, imports this package.
AutoConfig.register(LlamaMoeConfig.model_type, LlamaMoeConfig, exist_ok=True)


def get_classes(config: dict):
    """(Model, ModelArgs) for `config`: a nightshift family if it names one, else mlx-lm's."""
    module = FAMILIES.get(config.get("model_type", ""))
    if module is None:
        return mlx_lm_classes(config)
    family = importlib.import_module(f"nightshift.engine.models.{module}")
    return family.Model, family.ModelArgs
