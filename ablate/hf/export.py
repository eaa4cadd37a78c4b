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
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a folder of a few files: the verb prints one line when it is written
    modules = component_modules(model)
    model = model.float().eval()
    mapped = convert.to_builtin(model, max_positions=max_positions)
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(
            f"--out: cannot make the folder {out} ({e.strerror}); give a writable folder"
        ) from None
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
    hf_model.decoder.load_state_dict(model.state_dict())
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


def export_run(
    recipe: Any, stores: Any, *, scale: str, run: str, out: Path, checkpoint: str = "best"
) -> Exported:
    """The finished run named `run` (its name, e.g. `diff-s0`, or its MLflow run id; a budget branch's run id) of
    `recipe`'s sweep at `scale`, written to `out`; its MLflow run then links the folder."""
    from ablate.hf.runs import finished_run
    from ablate.hf.tokenizer import run_tokenizer
    from ablate.probes.run import load_model
    from ablate.store import names

    spec, run_id, client = finished_run(recipe, stores, scale, run, "export")
    try:
        model = load_model(spec, stores.workspace, checkpoint)
    except FileNotFoundError as e:
        raise UserError(
            f"--checkpoint: {spec.name}: {e}; choose the other checkpoint (best or last)"
        ) from None
    tokenizer, eos = run_tokenizer(spec.data, stores.workspace)
    source = {
        "recipe": spec.recipe,
        "scale": spec.scale,
        "run": spec.name,
        "run_key": spec.key,
        "mlflow_run_id": run_id,
        "checkpoint": checkpoint,
        "seq_len": spec.train.seq_len,
    }
    exported = export_model(
        model, out, tokenizer=tokenizer, eos=eos, max_positions=spec.train.seq_len, source=source
    )
    client.set_tag(run_id, names.HF_EXPORT, str(Path(out).resolve()))
    client.set_tag(run_id, names.HF_EXPORT_CLASS, exported.architecture)
    return exported
