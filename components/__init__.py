"""The built-in component zoo. Importing this package registers every built-in variant.

One kind per module (or folder for attention). The contract every component keeps is written once in
`ablate.core.contract`: what the block injects (attention: d_model, head_dim, layer_idx, n_layers, position,
backend; norm: dim; ffn: d_model; position: head_dim; lambda_init: nothing), and what a component may
tell the engine: `flops(seq_len)` (else it is counted automatically), `residual_out`, `init_std`,
`describe()` (its columns in `ablate check`), and for attention `attend_with_maps`.
"""

from components import ffn, lambda_init, norm, position  # noqa: F401
from components.attention import diff, diff_v2, softmax  # noqa: F401
