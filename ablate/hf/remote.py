"""The custom-code path of an export: ablate's own `DecoderLM` behind `transformers`' Auto classes.

An exported folder whose model has no built-in class (ablate.hf.convert) holds `modeling_ablate_lm.py`, two
lines that import `AblateConfig` and `AblateForCausalLM` from this module, and a config.json whose `auto_map`
names them; `AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)` then builds the model with
the installed `ablate` (no sources are copied: the folder's code is the version of ablate installed where it
loads). The config holds the run's `model:` section as it was resolved and the modules its components live in
(`imports`), imported before the model is built so a plugin's components are registered.

No key/value cache: each generation step runs the whole sequence again (the model's forward takes whole
sequences). An attention mask may only mark padding on the right, which a causal model's logits of the real
tokens never see; left padding is refused.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

MODULE_FILE = "modeling_ablate_lm.py"
MODULE_TEXT = (
    '"""An ablate model: the classes come from the installed `ablate` (pip install ablate[export])."""\n\n'
    "from ablate.hf.remote import AblateConfig, AblateForCausalLM  # noqa: F401\n"
)
AUTO_MAP = {
    "AutoConfig": "modeling_ablate_lm.AblateConfig",
    "AutoModelForCausalLM": "modeling_ablate_lm.AblateForCausalLM",
}


class AblateConfig(PretrainedConfig):
    """The run's resolved `model:` section (`ablate_model`) and the modules that register its components."""

    model_type = "ablate"

    def __init__(
        self, ablate_model: dict[str, Any] | None = None, imports: list[str] | None = None, **kwargs: Any
    ):
        self.ablate_model = dict(ablate_model or {})
        self.imports = list(imports or [])
        for key, name in (
            ("vocab_size", "vocab_size"),
            ("hidden_size", "d_model"),
            ("num_hidden_layers", "n_layers"),
        ):
            kwargs.setdefault(key, self.ablate_model.get(name))
        kwargs.setdefault("use_cache", False)
        kwargs.setdefault("tie_word_embeddings", bool(self.ablate_model.get("tie_embeddings", False)))
        super().__init__(**kwargs)

    @classmethod
    def register_for_auto_class(cls, auto_class: str = "AutoConfig") -> None:
        """Nothing: `transformers` calls it on classes loaded as remote code, so that saving copies their
        source files; an export writes its own two-line module instead (the installed ablate)."""


class AblateForCausalLM(PreTrainedModel, GenerationMixin):
    """`DecoderLM` as a causal LM of `transformers`: logits for whole sequences, greedy or sampled `generate`."""

    config_class = AblateConfig
    base_model_prefix = "decoder"
    _no_split_modules = ["Block"]

    def __init__(self, config: AblateConfig):
        super().__init__(config)
        for module in config.imports:
            importlib.import_module(module)
        from ablate.model.decoder import DecoderLM

        self.decoder = DecoderLM(config.ablate_model)
        if config.ablate_model.get("tie_embeddings"):
            self._tied_weights_keys = {"decoder.lm_head.weight": "decoder.embed.weight"}
        self.post_init()

    @classmethod
    def register_for_auto_class(cls, auto_class: str = "AutoModelForCausalLM") -> None:
        """Nothing, as `AblateConfig.register_for_auto_class` says."""

    def _init_weights(self, module: torch.nn.Module) -> None:
        """Nothing: every weight comes from the folder's safetensors."""

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.decoder.embed

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.decoder.lm_head

    def forward(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast:
        if attention_mask is not None and not _right_padded(attention_mask):
            raise ValueError("ablate's exported model takes padding on the right only (no left-padded masks)")
        logits = self.decoder(input_ids)
        loss = None
        if labels is not None:
            loss = torch.nn.functional.cross_entropy(
                logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100
            )
        return CausalLMOutputWithPast(loss=loss, logits=logits)

    def prepare_inputs_for_generation(self, input_ids: torch.LongTensor, **kwargs: Any) -> dict[str, Any]:
        """The whole sequence at every step (no cache)."""
        return {"input_ids": input_ids, "attention_mask": kwargs.get("attention_mask")}


def _right_padded(mask: torch.Tensor) -> bool:
    """Every row is ones then zeros (a non-increasing row)."""
    return bool((mask[:, 1:] <= mask[:, :-1]).all())
