"""The verbs of `ablate`: one module per verb, each holding its typed function (its options, which
`ablate.cli` hands to jsonargparse) and its orchestration: loading the recipe, calling the library folders
below, printing what the user sees. `options` holds what several verbs share.

`ablate.cli` maps argv onto these functions and nothing else; the library folders below never import a
verb. Heavy imports happen inside the functions, so `ablate --help` stays instant.
"""
