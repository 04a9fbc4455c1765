"""A synthetic language with learnable structure, generated from a seed (no downloads): the
convergence check's training data (``optbench.suite.convergence``).

The language is a fixed random Markov chain over the model's vocabulary: each token has
``branching`` successors, drawn from a Zipf distribution over a random permutation of the vocabulary
(so that, as in text, a few tokens are frequent and most are rare), with transition probabilities
from a flat Dirichlet. A model first learns the unigram frequencies (the loss falls fast from ln V),
then each token's successors (slowly, the rarer the token the later): a loss curve with the shape of
a real one, over a few hundred steps. Its floor is the chain's own loss on the corpus
(:attr:`Corpus.floor`), which no model can beat on average.

Everything is drawn on the host from one ``torch.Generator``, so the same seed gives the same tokens
on every machine; sequences are independent (each starts from a Zipf-drawn token).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class MarkovLanguage:
    """The chain's shape: ``vocab_size`` tokens, ``branching`` successors each, Zipf exponent
    ``zipf``; ``seed`` fixes the chain and the corpora drawn from it."""

    vocab_size: int
    branching: int = 8
    zipf: float = 1.0
    seed: int = 1234

    def chain(self) -> tuple[Tensor, Tensor, Tensor]:
        """(unigram weights (V,) of the start tokens, successors (V, branching) token ids,
        transition probabilities (V, branching) float64 rows summing to 1). A token may list a
        successor twice."""
        gen = torch.Generator().manual_seed(self.seed)
        V, k = self.vocab_size, self.branching
        rank = torch.randperm(V, generator=gen)  # token -> its frequency rank
        weights = (rank.double() + 1.0) ** -self.zipf
        successors = torch.multinomial(weights, V * k, replacement=True, generator=gen).view(V, k)
        # flat Dirichlet: normalized Exp(1)
        gaps = -torch.rand(V, k, generator=gen, dtype=torch.float64).log()
        return weights, successors, gaps / gaps.sum(1, keepdim=True)

    def corpus(self, sequences: int, length: int, seed: int = 0) -> Corpus:
        """``sequences`` independent token sequences of ``length`` tokens drawn from the chain
        (``seed``: which ones; the chain stays this language's)."""
        weights, successors, probs = self.chain()
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + seed)
        cumulative = probs.cumsum(1)
        tokens = torch.empty(sequences, length, dtype=torch.long)
        tokens[:, 0] = torch.multinomial(weights, sequences, replacement=True, generator=gen)
        log_likelihood = torch.zeros(sequences, dtype=torch.float64)
        for t in range(1, length):
            current = tokens[:, t - 1]
            draw = torch.rand(sequences, 1, generator=gen, dtype=torch.float64)
            choice = (cumulative[current] < draw).sum(1).clamp_(max=self.branching - 1)
            nxt = successors[current, choice]
            tokens[:, t] = nxt
            # the chain's probability of nxt after current (a successor listed twice counts twice)
            p = (probs[current] * (successors[current] == nxt[:, None])).sum(1)
            log_likelihood -= p.log()
        return Corpus(tokens, float(log_likelihood.sum() / (sequences * (length - 1))))


@dataclass(frozen=True)
class Corpus:
    """Token sequences (N, length) int64 on the host, and ``floor``: the chain's mean next-token
    loss on them (nats), the least a model's loss can be on average."""

    tokens: Tensor
    floor: float

    def batches(self, batch_size: int) -> Tensor:
        """The sequences as consecutive batches: (N // batch_size, batch_size, length)."""
        n = self.tokens.shape[0] // batch_size
        return self.tokens[: n * batch_size].view(n, batch_size, -1)


def unigram_entropy(language: MarkovLanguage) -> float:
    """Entropy (nats) of the start tokens' Zipf distribution: about where a model that learned only
    the token frequencies would be (the chain's stationary distribution is close to it)."""
    weights = language.chain()[0]
    p = weights / weights.sum()
    return float(-(p * p.log()).sum())


def uniform_loss(language: MarkovLanguage) -> float:
    """ln V (nats): the loss of a uniform guess, where a freshly initialized model starts."""
    return math.log(language.vocab_size)
