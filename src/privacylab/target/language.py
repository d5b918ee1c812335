"""`LanguageTarget`: a causal language model behind the threat model, counting every query.

Carlini et al. 2021 ("Extracting Training Data from Large Language Models", Sec. 3.1) give
the adversary black-box access to the model: the probability of any sequence, hence the
next-token distribution after any prefix, but no weights or hidden states. Here that is
`scores` access:

- `token_log_probs(tokens)`: log f(x_{t+1} | x_1..x_t) of each observed next token;
- `distributions(tokens)`: the whole next-token log-probability vector at every position
  (what Min-K%++, Zhang et al. 2024, needs);
- `sample(prefixes, new_tokens, choose)`: autoregressive generation where the attacker's
  `choose` picks each next token from the served distribution (top-n, a temperature...),
  run with the model's key/value cache.

`complete(prefixes, new_tokens)` (greedy continuation, the text an API returns) needs only
`label` access; `logits` needs logits access and `model` white-box access, as for every target.

Queries: one sequence scored, sampled or completed in one call is one query (the prefix
batch's rows); `tokens_served` adds up the next-token distributions served, so a budget can be
read either way. Views, budgets and monitors are `Target`'s: a view of a `LanguageTarget` is one.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from privacylab.data.tokenizer import EOS, PAD, ByteTokenizer
from privacylab.target.access import Access, AccessError, TargetError
from privacylab.target.target import OutputDefense, Precision, QueryMonitor, Target

Chooser = Callable[[Tensor, int], Tensor]
"""`choose(log_probs, step)`: the next token of each row, shape (n,) int64, from the served
next-token log-probabilities (n, vocab) at generation step `step` (0 for the first new token)."""

__all__ = ["Chooser", "LanguageTarget"]


class LanguageTarget(Target):
    """A causal LM as an attacker sees it (module docstring). `model(tokens)` must return
    logits of shape (n, L, vocab_size); a model with a `step(tokens, cache)` method (as
    `privacylab.models.gpt.CausalLM`) generates with its cache. `context` is the longest
    sequence it takes (default: the model's `max_len`)."""

    def __init__(
        self,
        model: nn.Module,
        access: Access | str,
        vocab_size: int,
        *,
        tokenizer: ByteTokenizer | None = None,
        context: int | None = None,
        query_budget: int | None = None,
        query_monitor: QueryMonitor | None = None,
        device: str | torch.device = "cpu",
        batch_size: int = 256,
        precision: Precision = "float32",
    ) -> None:
        super().__init__(
            model,
            access,
            vocab_size,
            query_budget=query_budget,
            query_monitor=query_monitor,
            device=device,
            batch_size=batch_size,
            precision=precision,
        )
        self.tokenizer = tokenizer or ByteTokenizer()
        length = context if context is not None else getattr(model, "max_len", None)
        if length is None or isinstance(length, bool) or int(length) < 2:
            raise TargetError("a language target needs its context length (context >= 2)")
        self.context = int(length)
        self._served = [0]

    @property
    def vocab_size(self) -> int:
        """Size of the next-token distribution."""
        return self.num_classes

    @property
    def tokens_served(self) -> int:
        """Next-token distributions served by this target and all its views."""
        return self._served[0]

    def _tokens(self, tokens: Tensor | np.ndarray, what: str) -> Tensor:
        try:
            tokens = torch.as_tensor(tokens)
        except (TypeError, ValueError, RuntimeError):
            raise TargetError(f"{what} must be integer token ids of shape (n, L)") from None
        if tokens.ndim != 2 or tokens.dtype not in (torch.int64, torch.int32):
            raise TargetError(f"{what} must be integer token ids of shape (n, L)")
        if tokens.shape[1] > self.context:
            raise TargetError(
                f"{what} are {tokens.shape[1]} tokens long; the model's context is {self.context}"
            )
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.vocab_size):
            raise TargetError(f"{what} hold ids outside the vocabulary [0, {self.vocab_size})")
        return tokens.to(torch.int64)

    def _check_logits(self, out: Tensor, rows: int, length: int) -> None:
        if out.shape != (rows, length, self.vocab_size):
            raise TargetError(
                f"the model returned shape {tuple(out.shape)}, expected "
                f"({rows}, {length}, {self.vocab_size}) (next-token logits per position)"
            )
        if not bool(torch.isfinite(out).all()):
            raise TargetError("the model returned NaN or infinite logits")

    @torch.no_grad()
    def _forward(self, tokens: Tensor, *, normalise: bool = True) -> Tensor:
        """Counted forward pass in `batch_size` chunks: next-token log-probabilities (n, L,
        vocab) on the CPU, or the raw logits when not `normalise`."""
        self._count(tokens)
        outs = []
        for i in range(0, int(tokens.shape[0]), self.batch_size):
            batch = tokens[i : i + self.batch_size].to(self.device)
            out = self._model(batch).to(self.dtype)
            self._check_logits(out, int(batch.shape[0]), int(batch.shape[1]))
            outs.append((F.log_softmax(out, dim=-1) if normalise else out).cpu())
        self._served[0] += int(tokens.shape[0]) * int(tokens.shape[1])
        if not outs:
            return torch.zeros(0, tokens.shape[1], self.vocab_size, dtype=self.dtype)
        return torch.cat(outs)

    def _scored(self, tokens: Tensor | np.ndarray) -> tuple[Tensor, Tensor]:
        """The checked token rows and the log-probabilities after each of their prefixes."""
        self.require(Access.SCORES)
        tokens = self._tokens(tokens, "token sequences")
        if tokens.shape[1] < 2:
            raise TargetError("scoring needs sequences of at least 2 tokens")
        return tokens, self._forward(tokens[:, :-1])

    def token_log_probs(self, tokens: Tensor | np.ndarray) -> Tensor:
        """log f(x_{t+1} | x_1..x_t) for t = 1..L-1, shape (n, L-1); NaN where the next token is
        PAD (a shorter row's padding). Needs scores access; one query per row."""
        tokens, logp = self._scored(tokens)
        nxt = tokens[:, 1:]
        picked = logp.gather(-1, nxt.clamp_max(self.vocab_size - 1).unsqueeze(-1)).squeeze(-1)
        return picked.masked_fill(nxt == PAD, float("nan"))

    def distributions(self, tokens: Tensor | np.ndarray) -> Tensor:
        """The next-token log-probability vectors after each prefix x_1..x_t, t = 1..L-1, shape
        (n, L-1, vocab) (rows whose next token is PAD included). Needs scores access."""
        return self._scored(tokens)[1]

    def logits(self, x: Tensor | np.ndarray) -> Tensor:
        """Raw next-token logits (n, L, vocab); needs logits access."""
        self.require(Access.LOGITS)
        return self._forward(self._tokens(x, "token sequences"), normalise=False)

    def sample(self, prefixes: Tensor | np.ndarray, new_tokens: int, choose: Chooser) -> Tensor:
        """Continue each prefix (n, P) by up to `new_tokens` tokens picked by `choose` from the
        served distributions (needs scores access). Returns (n, P + generated): a row that
        emitted EOS is PAD after it; generation stops when every row has ended or the context is
        full. One query per row."""
        self.require(Access.SCORES)
        return self._generate(prefixes, new_tokens, choose)

    def complete(self, prefixes: Tensor | np.ndarray, new_tokens: int) -> Tensor:
        """Greedy continuation of each prefix (the most likely token each step), as `sample`;
        needs only label access (an API that returns text)."""
        return self._generate(prefixes, new_tokens, lambda logp, step: logp.argmax(-1))

    @torch.no_grad()
    def _generate(self, prefixes: Tensor | np.ndarray, new_tokens: int, choose: Chooser) -> Tensor:
        tokens = self._tokens(prefixes, "prefixes")
        if tokens.shape[1] < 1:
            raise TargetError("generation needs a prefix of at least one token (e.g. BOS)")
        whole = isinstance(new_tokens, int | np.integer) and not isinstance(new_tokens, bool)
        if not whole or new_tokens < 1:
            raise TargetError(f"new_tokens must be a whole number >= 1, got {new_tokens!r}")
        if bool((tokens == PAD).any()):
            raise TargetError("prefixes may not hold PAD: group prefixes of equal length")
        steps = min(int(new_tokens), self.context - int(tokens.shape[1]))
        self._count(tokens)
        rows = []
        for i in range(0, int(tokens.shape[0]), self.batch_size):
            rows.append(self._generate_batch(tokens[i : i + self.batch_size], steps, choose))
        if not rows:
            return tokens.clone()
        width = max(r.shape[1] for r in rows)
        return torch.cat([F.pad(r, (0, width - r.shape[1]), value=PAD) for r in rows])

    def _generate_batch(self, prefix: Tensor, steps: int, choose: Chooser) -> Tensor:
        model = self._model
        cached = callable(getattr(model, "step", None))
        seq = prefix.to(self.device)
        done = torch.zeros(seq.shape[0], dtype=torch.bool, device=self.device)
        cache = None
        feed = seq
        for step in range(steps):
            if cached:
                out, cache = model.step(feed, cache)
            else:
                out = model(seq)
            last = out[:, -1].to(self.dtype)
            self._check_logits(last[:, None], int(seq.shape[0]), 1)
            self._served[0] += int((~done).sum())
            chosen = torch.as_tensor(choose(F.log_softmax(last, -1).cpu(), step)).to(self.device)
            if chosen.shape != (seq.shape[0],):
                raise TargetError(
                    f"the token chooser returned shape {tuple(chosen.shape)}, "
                    f"expected ({seq.shape[0]},)"
                )
            if chosen.dtype.is_floating_point or chosen.dtype == torch.bool:
                raise TargetError(f"the token chooser returned {chosen.dtype}, not token ids")
            if chosen.numel() and (int(chosen.min()) < 0 or int(chosen.max()) >= self.vocab_size):
                raise TargetError(
                    f"the token chooser returned ids outside the vocabulary [0, {self.vocab_size})"
                )
            chosen = chosen.to(torch.int64).masked_fill(done, PAD)
            seq = torch.cat([seq, chosen[:, None]], 1)
            feed = chosen[:, None]
            done |= chosen == EOS
            if bool(done.all()):
                break
        return seq.cpu()

    def labels(self, x: Tensor | np.ndarray) -> Tensor:
        """A language model has no class labels: TargetError (use `complete`)."""
        raise TargetError("a language model has no class labels; use complete() or sample()")

    def probabilities(self, x: Tensor | np.ndarray) -> Tensor:
        """Use `distributions` (next-token log-probabilities) for a language model."""
        raise TargetError("use distributions() or token_log_probs() on a language model")

    def with_output_defense(self, defense: OutputDefense, serves: Access | str) -> Target:
        """Output defences of class probability vectors do not apply to a language model."""
        raise AccessError("output defences apply to classifiers, not to a language target")
