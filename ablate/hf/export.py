"""A model (or a study's finished run) written as a `transformers` folder: `model.safetensors`, `config.json`,
`tokenizer.json` with its `tokenizer_config.json`, and `ablate_export.json` (where it came from).

The model takes a built-in class where one computes it (ablate.hf.convert: Llama, DiffLlama; no remote code),
else the custom-code path (ablate.hf.remote; `trust_remote_code=True`, the installed ablate). A component
that no loader could import (defined in `__main__` or inside a function) is refused in one line naming it.
A run's export is linked from its MLflow run (tags `ablate.export`, `ablate.export.class`).
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ablate.core.errors import UserError
from ablate.hf import convert
from ablate.model.decoder import DecoderLM

EXPORT_FILE = "ablate_export.json"


@dataclass(frozen=True)
class Exported:
    folder: Path
    architecture: str  # LlamaForCausalLM | DiffLlamaForCausalLM | AblateForCausalLM
    remote_code: bool
    why_custom: str | None  # what kept it out of the built-in classes


def component_modules(model: DecoderLM) -> list[str]:
    """The modules a loader imports so `model`'s components are registered; a component no loader could
    import is a `UserError` naming it."""
    modules = []
    for path, module in [
        *model.components(),
        *((f"{p}.position", m.position) for p, m in _attentions(model)),
    ]:
        cls = type(module)
        where = cls.__module__
        if where == "__main__" or "<locals>" in cls.__qualname__ or importlib.util.find_spec(where) is None:
            raise UserError(
                f"export: {path} is {cls.__qualname__} from {where}, which no loader can import; define the "
                "component in an importable module (a plugin package or a recipe's imports:) and export again"
            )
        if where not in modules:
            modules.append(where)
    return modules


def _attentions(model: DecoderLM):
    return [(f"blocks.{i}.attention", b.attention) for i, b in enumerate(model.blocks)]


def export_model(
    model: DecoderLM,
    out: Path,
    *,
    tokenizer: Any,
    eos: str,
    max_positions: int,
    source: dict[str, Any] | None = None,
) -> Exported:
    """Write `model` (float32, as trained) and `tokenizer` (a `tokenizers.Tokenizer`) into the folder `out`."""
    modules = component_modules(model)
    model = model.float().eval()
    mapped = convert.to_builtin(model, max_positions=max_positions)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    eos_id = tokenizer.token_to_id(eos)
    if isinstance(mapped, convert.Mapped):
        hf_model = _builtin(mapped, eos_id)
        exported = Exported(out, mapped.architecture, remote_code=False, why_custom=None)
    else:
        hf_model = _custom(model, modules, max_positions, eos_id)
        exported = Exported(out, "AblateForCausalLM", remote_code=True, why_custom=mapped)
    hf_model.save_pretrained(out)
    if exported.remote_code:
        from ablate.hf.remote import MODULE_FILE, MODULE_TEXT

        (out / MODULE_FILE).write_text(MODULE_TEXT)
    _save_tokenizer(tokenizer, eos, max_positions, out)
    record = {
        "architecture": exported.architecture,
        "trust_remote_code": exported.remote_code,
        "why_custom_code": exported.why_custom,
        "component_modules": modules,
        **(source or {}),
    }
    (out / EXPORT_FILE).write_text(json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")
    return exported


@torch.no_grad()
def _builtin(mapped: convert.Mapped, eos_id: int) -> Any:
    import transformers

    name = mapped.architecture.removesuffix("ForCausalLM")
    config = getattr(transformers, f"{name}Config")(**mapped.config, eos_token_id=eos_id)
    hf_model = getattr(transformers, mapped.architecture)(config).float()
    missing, unexpected = hf_model.load_state_dict(mapped.state_dict, strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise AssertionError(f"{mapped.architecture}: missing {missing}, unexpected {unexpected}")
    return hf_model.eval()


@torch.no_grad()
def _custom(model: DecoderLM, modules: list[str], max_positions: int, eos_id: int) -> Any:
    from ablate.hf.remote import AUTO_MAP, AblateConfig, AblateForCausalLM

    config = AblateConfig(
        ablate_model=json.loads(json.dumps(model.config.to_dict())),
        imports=modules,
        auto_map=AUTO_MAP,
        max_position_embeddings=max_positions,
        eos_token_id=eos_id,
    )
    hf_model = AblateForCausalLM(config).float()
    hf_model.ablate.load_state_dict(model.state_dict())
    return hf_model.eval()


def _save_tokenizer(tokenizer: Any, eos: str, max_positions: int, out: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=eos,
        model_max_length=max_positions,
        split_special_tokens=True,  # as ablate encodes: a literal end-of-document spelling is text
    )
    fast.save_pretrained(out)
