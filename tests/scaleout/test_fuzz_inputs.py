"""Malformed recipes and overrides end in one clean line and exit code 2, never a traceback.

Property-based (hypothesis): random YAML documents, mutations of a valid recipe (wrong types, unknown
keys, bad numbers, bad component names, missing keys) and random dotted overrides go through
`ablate check` exactly as the command line does. Every example must exit 0 (still a valid recipe) or 2
with exactly one line on stderr; any other exception is a bug. Examples that found bugs are kept below
as regression tests, also run through a fresh interpreter.
"""

from __future__ import annotations

import contextlib
import copy
import io
from pathlib import Path

import pytest
import yaml
from fuzzing import bounded, fuzz_settings
from hypothesis import example, given
from hypothesis import strategies as st
from scaleout_helpers import run_cli

from ablate.cli import main

pytestmark = pytest.mark.scaleout

VALID = {
    "name": "fuzz",
    "seeds": [0],
    "base": {
        "model": {
            "vocab_size": 64,
            "d_model": 16,
            "n_layers": 2,
            "head_dim": 8,
            "attention": "softmax",
            "attention_backend": "math",
        },
        "train": {
            "seq_len": 16,
            "batch_tokens": 64,
            "micro_batch_size": 4,
            "steps": 4,
            "lr": 1e-3,
            "warmup_steps": 1,
            "precision": "32-true",
            "betas": [0.9, 0.98],
            "val_batches": 2,
            "devices": 1,
            "num_nodes": 1,
            "strategy": "auto",
            "accelerator": "cpu",
        },
        "data": {"source": "stdlib", "tokenizer": "byte", "val_fraction": 0.1},
    },
    "variants": {
        "transformer": {"label": "Transformer", "model": {"attention": {"name": "softmax"}}},
        "diff": {"label": "Diff", "model": {"attention": {"name": "diff"}}},
    },
    "scales": {"tiny": {"model": {"d_model": 16}, "train": {"steps": 2}}},
    "tolerance": {"params": 0.05, "flops": 0.05},
    "default_scale": "tiny",
    "imports": [],
}

KNOWN_WORDS = [
    "name",
    "seeds",
    "base",
    "variants",
    "scales",
    "sizes",
    "imports",
    "tolerance",
    "default_scale",
    "model",
    "train",
    "data",
    "label",
    "attention",
    "norm",
    "ffn",
    "position",
    "lambda_init",
    "class_path",
    "init_args",
    "d_model",
    "n_layers",
    "head_dim",
    "vocab_size",
    "seq_len",
    "lr",
    "steps",
    "batch_tokens",
    "micro_batch_size",
    "devices",
    "num_nodes",
    "strategy",
    "precision",
    "source",
    "tokenizer",
    "softmax",
    "diff",
    "rmsnorm",
    "swiglu",
    "rope",
    "params",
    "flops",
    "val_fraction",
    "betas",
    "paper",
    "description",
]

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-8, 300),
    st.sampled_from([0, -1, 2**31, 2**63]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e-300, 1e308, -0.0]),
    st.text(max_size=12),
    st.sampled_from(KNOWN_WORDS),
)
KEYS = st.one_of(st.sampled_from(KNOWN_WORDS), st.text(max_size=8), st.integers(-3, 3), st.booleans())
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(KEYS, inner, max_size=4)),
    max_leaves=12,
)
OVERRIDE_KEYS = st.one_of(
    st.sampled_from(
        [
            "base.model.d_model",
            "base.model.attention",
            "base.model.attention.name",
            "base.train.lr",
            "base.train.devices",
            "base.train.strategy",
            "base.train.betas",
            "base.data.source",
            "base.nope.x",
            "seeds",
            "variants.diff.model.attention",
            "variants.nope.label",
            "scales.tiny.model.d_model",
            "default_scale",
            "tolerance.params",
            "name",
            "imports",
            "base.model.attention.lambda_init",
            "base.train",
            "base",
            "variants",
            "base.0.x",
        ]
    ),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz_.0123456789-", min_size=0, max_size=20),
)
OVERRIDE_VALUES = st.one_of(
    st.sampled_from(
        [
            "1e-3",
            "nan",
            ".inf",
            "-1",
            "0",
            "[1, 2]",
            "{a: 1}",
            "null",
            "true",
            "diff",
            "softmax",
            "{name: nope}",
            "'",
            "[",
            "1e400",
            "{class_path: os.system}",
            "2**8",
            "ddp_spawn",
            "- a",
        ]
    ),
    st.text(max_size=10),
)


def check(path: Path, *extra: str) -> tuple[int, str]:
    """`ablate check PATH EXTRA...` in this process; (exit code, stderr). Other exceptions propagate."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code = main(["check", str(path), *extra])
        except SystemExit as e:  # argparse's --help (also reached as an abbreviation: --h)
            code = e.code
    return code, err.getvalue()


def assert_clean(code: int, err: str) -> None:
    assert code in (0, 2), (code, err)
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("ablate: error: "), err
        assert "Traceback" not in err


def _write(folder: Path, document: object) -> Path:
    path = folder / "fuzz.yaml"
    path.write_text(yaml.safe_dump(document, allow_unicode=True))
    return path


# A fixed test by default and under CI; `ABLATE_FUZZ_EXAMPLES=5000` searches at random (tests/fuzzing.py).
FUZZ = fuzz_settings()


@FUZZ
@given(document=VALUES)
@bounded()
def test_random_yaml_documents(tmp_path, document):
    assert_clean(*check(_write(tmp_path, document)))


@FUZZ
@given(text=st.text(max_size=200))
@bounded()
def test_random_text_files(tmp_path, text):
    path = tmp_path / "fuzz.yaml"
    path.write_text(text)
    assert_clean(*check(path))


def _paths(tree: object, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value in nested dicts/lists."""
    out = [prefix] if prefix else []
    if isinstance(tree, dict):
        for key, value in tree.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            out += _paths(value, (*prefix, i))
    return out


@FUZZ
@given(data=st.data())
@example(data=None)  # the valid recipe itself
@bounded()
def test_mutated_recipes(tmp_path, data):
    recipe = copy.deepcopy(VALID)
    if data is not None:
        for _ in range(data.draw(st.integers(1, 3), label="mutations")):
            path = data.draw(st.sampled_from(_paths(recipe)), label="path")
            parent = recipe
            for part in path[:-1]:
                parent = parent[part]
            action = data.draw(st.sampled_from(["replace", "delete", "add_key"]), label="action")
            if action == "replace":
                parent[path[-1]] = data.draw(VALUES, label="value")
            elif action == "delete" and isinstance(parent, dict):
                del parent[path[-1]]
            elif isinstance(parent[path[-1]], dict):
                parent[path[-1]][data.draw(KEYS, label="key")] = data.draw(VALUES, label="value")
    code, err = check(_write(tmp_path, recipe))
    assert_clean(code, err)
    if data is None:
        assert code == 0, err


@FUZZ
@given(
    pairs=st.lists(
        st.tuples(OVERRIDE_KEYS, OVERRIDE_VALUES, st.sampled_from(["space", "equals", "bare"])),
        min_size=1,
        max_size=3,
    )
)
@bounded()
def test_random_dotted_overrides(tmp_path, pairs):
    argv = []
    for key, value, form in pairs:
        argv += {"space": [f"--{key}", value], "equals": [f"--{key}={value}"], "bare": [f"{key}={value}"]}[
            form
        ]
    assert_clean(*check(_write(tmp_path, VALID), *argv))


# --- examples the fuzzing found (each was an uncaught exception before its fix) -----------------------------
def _with(*changes: tuple[tuple, object]) -> dict:
    """VALID with the value at each path replaced."""
    recipe = copy.deepcopy(VALID)
    for path, value in changes:
        node = recipe
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value
    return recipe


REGRESSIONS: list[tuple[str, object, list[str]]] = [
    ("data-is-a-number", _with((("base", "data"), 1)), []),  # TypeError: 'int' object is not iterable
    ("data-is-a-string", _with((("base", "data"), "0")), []),  # ValueError: dictionary update sequence
    ("data-number-key", _with((("base", "data"), {0: None})), []),  # TypeError: 'int' object is not iterable
    ("data-mixed-keys", _with((("base", "data"), {"name": None, 0: None})), []),  # TypeError: '<' str and int
    ("scales-is-a-bool", _with((("scales",), True)), []),  # TypeError: 'bool' object is not iterable
    ("scale-model-is-a-bool", _with((("scales", "tiny", "model"), True)), []),  # TypeError: ... not iterable
    ("variant-model-null", _with((("variants", "diff", "model"), None)), []),  # TypeError: 'NoneType' ...
    ("devices-zero", _with((("base", "train", "devices"), 0)), []),  # ZeroDivisionError: modulo by zero
    ("devices-zero-override", VALID, ["--base.train.devices", "0"]),  # the same through an override
    # Never ended: the model was built one module per layer, and a float was taken as a layer count.
    ("n-layers-4.1e116", _with((("base", "model", "n_layers"), 4.1e116)), []),
    ("n-layers-1e5", _with((("base", "model", "n_layers"), 10**5)), []),
]


@pytest.mark.parametrize("label,document,argv", REGRESSIONS, ids=[r[0] for r in REGRESSIONS])
def test_regressions_in_process(tmp_path, label, document, argv):
    code, err = check(_write(tmp_path, document), *argv)
    assert code == 2, err
    assert_clean(code, err)


def test_regressions_through_the_command_line(tmp_path):
    """The same examples as a user runs them: a fresh interpreter, exit 2, one line, no traceback."""
    for label, document, argv in REGRESSIONS[::4]:
        proc = run_cli("check", str(_write(tmp_path, document)), *argv, cwd=tmp_path)
        err = proc.stderr.strip()
        assert proc.returncode == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, (
            label,
            proc.stderr,
        )
