"""A recipe file -> typed runs.

`resolve` (the recipe's types, `load_recipe`, `Recipe.resolve` -> `RunSpec`s, overrides, the resolved
recipe), `matching` (`match:` knobs solved against the first row), `search` (search specs of a sweep),
`check` (`ablate check`: every row's cost and whether they are matched).
"""
