"""The two tasks tiny models are pretrained on, and the two pieces of training students write.

Bigram-Backcopy (Guo et al. 2024, *Active-Dormant Attention Heads*): tokens follow a fixed random bigram chain,
except that right after one of a few trigger tokens the next token copies the token before the trigger.
``TextBytes``: Austen as bytes (the split's characters), for the contrast. ``prepend_sink`` and ``lm_loss`` are
notebook 06's exercises.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["TEXT_DATA", "BigramBackcopy", "TextBytes", "make_task", "prepend_sink", "lm_loss"]


class BigramBackcopy:
    """Bigram-Backcopy sequences over ``vocab`` content tokens (ids 0..vocab-1).

    Transition rows: Dirichlet(alpha) mixed with ``uniform`` of a uniform row. The triggers are
    the most frequent tokens of the chain; after a trigger the next token copies the token
    before the trigger. Fixed by ``seed``.
    """

    def __init__(self, vocab: int = 64, n_triggers: int = 3, alpha: float = 0.05, uniform: float = 0.02,
                 seed: int = 1234) -> None:
        self.vocab = vocab
        dirichlet = torch.distributions.Dirichlet(torch.full((vocab,), alpha))
        with torch.random.fork_rng(devices=[]):  # Dirichlet sampling uses the global generator: leave it as it was
            torch.manual_seed(seed)
            rows = dirichlet.sample((vocab,))
        self.transition = (1 - uniform) * rows + uniform / vocab  # [V, V]
        stationary = torch.full((vocab,), 1.0 / vocab)
        for _ in range(200):  # power iteration: how often each token occurs in a long chain
            stationary = stationary @ self.transition
        self.triggers = stationary.topk(n_triggers).indices  # the most frequent tokens, as in Guo et al.
        self.is_trigger = torch.zeros(vocab, dtype=torch.bool)
        self.is_trigger[self.triggers] = True

    def sample(self, batch: int, length: int, generator: torch.Generator) -> Tensor:
        """[batch, length] content tokens."""
        x = torch.empty(batch, length, dtype=torch.long)
        non_trigger = (~self.is_trigger).float()
        x[:, 0] = torch.multinomial(non_trigger.expand(batch, -1), 1, generator=generator)[:, 0]
        for t in range(1, length):
            nxt = torch.multinomial(self.transition[x[:, t - 1]], 1, generator=generator)[:, 0]
            if t >= 2:
                copy = self.is_trigger[x[:, t - 1]]
                nxt = torch.where(copy, x[:, t - 2], nxt)
            x[:, t] = nxt
        return x

    def copy_targets(self, x: Tensor) -> Tensor:
        """[B, T] bool: positions whose token is a copy (the token before them is a trigger)."""
        out = torch.zeros_like(x, dtype=torch.bool)
        out[:, 2:] = self.is_trigger[x[:, 1:-1]]
        return out


TEXT_DATA = 2  # text runs before 2 read every character of the novels, exploration's share included


class TextBytes:
    """Austen as bytes (vocabulary 256): random windows of the characters of the six novels that ``split`` may read
    (``course.splits``; None: the split in force), each novel's share recorded as drawn."""

    def __init__(self, split: str | None = None) -> None:
        from course.assets import AUSTEN_BOOKS
        from course.data import load_split_text

        text = "\n\n".join(load_split_text(book, split)[0] for book in AUSTEN_BOOKS.values())
        self.data = torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8)
        self.vocab = 256

    def sample(self, batch: int, length: int, generator: torch.Generator) -> Tensor:
        starts = torch.randint(0, len(self.data) - length - 1, (batch,), generator=generator)
        return torch.stack([self.data[s : s + length] for s in starts.tolist()]).long()


def make_task(name: str):
    return BigramBackcopy() if name == "bigram-backcopy" else TextBytes()


def prepend_sink(x: Tensor, sink_id: int) -> Tensor:
    """Put the sink token in front of every sample: [B, T] -> [B, T + 1]."""
    return torch.cat([torch.full_like(x[:, :1], sink_id), x], dim=1)


def lm_loss(logits: Tensor, inputs: Tensor, n_prefix: int) -> Tensor:
    """Next-token loss on the content only.

    logits: [B, N, V] for inputs [B, N] whose first ``n_prefix`` tokens are a prefix (the sink
    token) that is never a prediction target. Position i predicts token i + 1.
    """
    targets = inputs[:, max(n_prefix, 1) :]
    preds = logits[:, max(n_prefix, 1) - 1 : -1]
    return F.cross_entropy(preds.reshape(-1, preds.shape[-1]), targets.reshape(-1))
