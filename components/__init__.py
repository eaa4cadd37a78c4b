"""The built-in component zoo. Importing this package registers every built-in variant.

One kind per module (or folder for attention). The contract every component keeps:

- It is built by `ablate.registry.build(kind, spec, **structure)`: the model injects the structure it
  knows as keyword arguments (attention: d_model, head_dim, layer_idx, n_layers, position, backend;
  norm: dim; ffn: d_model; position: head_dim; lambda_init: nothing), and the recipe supplies the
  rest. A constructor takes only the injected names it needs.
- A module that multiplies matrices reports `flops(seq_len) -> int`: forward FLOPs for one sequence
  of `seq_len` tokens, 2*m*n*k per matrix product, attention maps counted dense (N x N, as
  FlopCounterMode counts them), element-wise work not counted. `ablate.budget` sums these.
- Initialisation is the model's (see `ablate.model.DecoderLM`); a component can list parameters that
  need another one in `init_std` ({local name: std of a zero-mean normal}) and residual output
  projections in `residual_out` (scaled by 1/sqrt(2 n_layers)).
"""

from components import ffn, lambda_init, norm, position  # noqa: F401
from components.attention import diff, softmax  # noqa: F401
