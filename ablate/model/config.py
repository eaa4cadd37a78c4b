"""The recipe's `model:` section (`ModelConfig`), every default explicit: what `DecoderLM` is built from."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ablate.core.config import check_sizes, load_section, size
from ablate.core.errors import UserError
from ablate.core.registry import Spec
from ablate.model import parametrization as param

# Model keys added after runs were recorded: a run's key counts them only away from these defaults, so a
# run recorded before them keeps its key (ablate.recipe.schema.RunSpec.identity).
MODEL_KEYS_ADDED_LATER = {"parametrization": "standard"}

# The size knobs' limits (ablate.core.config.size): past the largest models trained today (vocabularies
# of 256K, widths of 16K, 128 layers) and short of a model no check could finish.
MAX_VOCAB = 1 << 21
MAX_WIDTH = 1 << 16
MAX_LAYERS = 1024
MAX_HEAD_DIM = 1 << 12


@dataclass(frozen=True)
class ModelConfig:
    """The recipe's `model:` section, every default explicit.

    Attributes:
        vocab_size: token vocabulary size (the data's tokenizer must fit in it)
        d_model: residual stream width
        n_layers: decoder blocks
        head_dim: the Transformer's head dimension d (Table 6 / Table 10); attentions derive heads from it
        attention: attention component (kind attention): a name, {name: ..., <options>} or class_path/init_args
        norm: norm component (kind norm) for the block and final norms
        ffn: feed-forward component (kind ffn)
        position: position component (kind position)
        attention_backend: how attention runs: a backend of components.attention.backends.TABLE (auto, math,
            sdpa, ...; docs/recipes-and-components.md lists them all)
        tie_embeddings: share the embedding and LM-head matrices
        init_std: standard deviation of the matrices' initialisation (GPT-2 / LLaMA 0.02)
        zero_init_residual: residual output projections start at zero (every variant starts as the same function)
        parametrization: standard, or mup with its base shape: {name: mup, base_d_model, base_head_dim,
            base_n_layers, depth: none | completep} (ablate.model.parametrization)
    """

    vocab_size: int = size(MAX_VOCAB)
    d_model: int = size(MAX_WIDTH)
    n_layers: int = size(MAX_LAYERS)
    head_dim: int = size(MAX_HEAD_DIM)
    attention: Spec = "softmax"
    norm: Spec = "rmsnorm"
    ffn: Spec = "swiglu"
    position: Spec = field(default_factory=lambda: {"name": "rope", "style": "interleaved"})
    attention_backend: str = "auto"
    tie_embeddings: bool = False
    init_std: float = 0.02
    zero_init_residual: bool = True
    parametrization: Spec = "standard"

    def __post_init__(self) -> None:
        check_sizes(self, "model")
        if self.d_model % self.head_dim:
            raise UserError(f"model.head_dim: {self.head_dim} does not divide d_model {self.d_model}")
        parsed = param.parse(
            self.parametrization, d_model=self.d_model, head_dim=self.head_dim, n_layers=self.n_layers
        )
        # The record keeps the spec with every key; the model reads the parsed form (`parsed_parametrization`).
        object.__setattr__(self, "parametrization", param.as_spec(parsed))
        object.__setattr__(self, "_parsed_parametrization", parsed)

    @property
    def parsed_parametrization(self) -> param.Parametrization:
        """`parametrization` as checked when the config was made: parsed once, not again by each reader."""
        return self._parsed_parametrization

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], key: str = "model") -> ModelConfig:
        """The section's types checked by jsonargparse (`ablate.core.config.load_section`)."""
        return load_section(cls, raw, key, what="model key")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
