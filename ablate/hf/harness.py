"""ablate's model for LM Eval Harness (`@register_model("ablate")`): a `DecoderLM` and ablate's tokenizer, scored
by the harness's own tasks and metrics.

It is the harness's `TemplateLM` (the harness splits each request into context and continuation tokens);
the scoring is ablate's model on the concatenation, left-truncated to `max_length + 1` tokens as the harness's
`hf` model truncates, each continuation token's log-probability read from the position before it (float32
log-softmax), and `is_greedy` when every continuation token is the argmax. An empty context is conditioned on
the end-of-document token (the tokenizer has no BOS). `loglikelihood_rolling` scores a whole text in disjoint
windows (the harness's `get_rolling_token_windows`); `generate_until` decodes greedily.

From Python: `AblateLM(model=..., tokenizer=...)` handed to `lm_eval.simple_evaluate(model=...)`. From the
harness's command line: import this module first so the name is registered, and name a run by its recipe
(docs/export-and-downstream.md): `--model ablate --model_args recipe=R.yaml,run=diff-s0,workspace_folder=ablate-runs`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model

NAME = "ablate"


@register_model(NAME)
class AblateLM(TemplateLM):
    """A `DecoderLM` with ablate's tokenizer as a harness model (module docstring)."""

    def __init__(
        self,
        model: Any = None,
        tokenizer: Any = None,
        *,
        max_length: int = 2048,
        batch_size: int | str = 8,
        recipe: str | None = None,
        run: str | None = None,
        workspace_folder: str | None = None,
        scale: str | None = None,
        checkpoint: str = "best",
        device: str | None = None,
        **_: Any,
    ):
        super().__init__()
        if model is None:  # the harness's command line: a run named by its recipe
            model, tokenizer, max_length = _run_parts(recipe, run, workspace_folder, scale, checkpoint)
        # the harness's command line asks for cuda by default, also on a machine without it
        if device is None or (str(device).startswith("cuda") and not torch.cuda.is_available()):
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model = model.eval().to(device)
        self.tok = tokenizer
        self._max_length = int(max_length)
        self.batch_size = int(batch_size) if str(batch_size).isdigit() else 8
        self._device = torch.device(device)

    @property
    def eot_token_id(self) -> int:
        return int(self.tok.eos_id)

    @property
    def max_length(self) -> int:
        return self._max_length

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        return [int(t) for t in self.tok.encode(string)]

    def tok_decode(self, tokens: list[int], **kwargs: Any) -> str:
        return self.tok.decode(tokens)

    @torch.no_grad()
    def _loglikelihood_tokens(self, requests: list, disable_tqdm: bool = False, **kwargs: Any) -> list:
        """(sum of the continuation's log-probabilities, whether it is the greedy continuation) per request."""
        prepared = []
        for _, context, continuation in requests:
            whole = (context + continuation)[-(self.max_length + 1) :]
            prepared.append((whole[:-1], len(continuation), whole[len(whole) - len(continuation) :]))
        order = sorted(range(len(prepared)), key=lambda i: -len(prepared[i][0]))
        results: list[tuple[float, bool] | None] = [None] * len(prepared)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            width = max(len(prepared[i][0]) for i in chunk)
            batch = torch.zeros(len(chunk), width, dtype=torch.long)  # padded on the right: causal, unseen
            for row, i in enumerate(chunk):
                batch[row, : len(prepared[i][0])] = torch.tensor(prepared[i][0])
            logprobs = F.log_softmax(self.model(batch.to(self._device)).float(), dim=-1).cpu()
            for row, i in enumerate(chunk):
                inputs, n, target = prepared[i]
                scores = logprobs[row, len(inputs) - n : len(inputs)]  # (n, vocab)
                wanted = torch.tensor(target)
                picked = scores.gather(1, wanted[:, None]).squeeze(1)
                results[i] = (float(picked.sum()), bool((scores.argmax(-1) == wanted).all()))
        return results

    def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list[float]:
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        out = []
        for (text,) in [r.args for r in requests]:
            windows = [
                make_disjoint_window(w)
                for w in get_rolling_token_windows(
                    token_list=self.tok_encode(text),
                    prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length,
                    context_len=1,
                )
            ]
            scored = self._loglikelihood_tokens([(None, c, t) for c, t in windows])
            out.append(sum(ll for ll, _ in scored))
        return out

    @torch.no_grad()
    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
        out = []
        for context, gen_kwargs in [r.args for r in requests]:
            until = gen_kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            steps = int(gen_kwargs.get("max_gen_toks", 256))
            tokens = self.tok_encode(context)[-self.max_length :] or [self.eot_token_id]
            produced: list[int] = []
            for _ in range(steps):
                window = torch.tensor([(tokens + produced)[-self.max_length :]], device=self._device)
                nxt = int(self.model(window)[0, -1].argmax())
                if nxt == self.eot_token_id:
                    break
                produced.append(nxt)
                if any(u in self.tok_decode(produced) for u in until):
                    break
            text = self.tok_decode(produced)
            for u in until:
                text = text.split(u)[0]
            out.append(text)
        return out


def _run_parts(recipe: str | None, run: str | None, folder: str | None, scale: str | None, checkpoint: str):
    """(model, tokenizer, max_length) of a finished run named by recipe and run name (the harness's CLI)."""
    from ablate.core.errors import UserError

    if not recipe or not run:
        raise UserError(
            "model_args: give recipe=RECIPE.yaml,run=NAME (and workspace_folder=, scale=, checkpoint=)"
        )
    from ablate.hf.runs import ablate_tokenizer, finished_run
    from ablate.probes.run import load_model
    from ablate.recipe.loading import load_recipe
    from ablate.store.stores import Stores

    loaded = load_recipe(recipe, [], scale=scale)
    stores = Stores(folder or "ablate-runs")  # the command line's default workspace (ablate.verbs.options)
    spec, _, _ = finished_run(loaded, stores, loaded.scale, run, "eval")
    model = load_model(spec, stores.workspace, checkpoint)
    return model, ablate_tokenizer(spec.data, stores.workspace), spec.train.seq_len
