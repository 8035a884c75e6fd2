"""How answers are decoded (the `Tokens` readout; the batch runs in `passes.generate_batch`): greedy, or
sampled with temperature, top-p and a repetition penalty. A sampled token depends
only on the seed, the row's key (a question id) and the step: the exponential race argmax p_i / q_i over the
top-p tokens (as vLLM), q ~ Exp(1) seeded by the three: reruns, batch sizes, OOM splits agree but for ties."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import LogitsProcessor

# greedy search with none of a model's own sampling defaults (our sampling is a logits processor)
GREEDY = {"do_sample": False, "top_p": None, "top_k": None, "temperature": None, "repetition_penalty": None}


@dataclass(frozen=True)
class Decoding:
    """How answers are decoded: greedy (temperature 0), or sampled."""

    temperature: float = 0.0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int = 0

    @property
    def sampled(self) -> bool:
        return self.temperature > 0

    @classmethod
    def from_config(cls, cfg: dict | None) -> Decoding:
        """A decoding section of the config: {mode: greedy} or {mode: sampled, temperature, top_p, ...}."""
        cfg = cfg or {}
        penalty = float(cfg.get("repetition_penalty", 1.0))
        if cfg.get("mode", "greedy") != "sampled":
            return cls(repetition_penalty=penalty)
        return cls(float(cfg["temperature"]), float(cfg.get("top_p", 1.0)), penalty, int(cfg.get("seed", 0)))


def race_noise(seed: int, key: str, step: int, n: int, device) -> torch.Tensor:
    """q ~ Exp(1) for n tokens, fixed by (seed, key, step) alone (on `device`'s own generator)."""
    digest = hashlib.blake2b(f"{seed}\0{key}\0{step}".encode(), digest_size=8).digest()
    gen = torch.Generator(device=device).manual_seed(int.from_bytes(digest, "big"))
    return torch.empty(n, device=device).exponential_(generator=gen)


class RowDecoding(LogitsProcessor):
    """Repetition penalty over each row's real tokens, then, when sampling, temperature, top-p and each row's
    own exponential race (`race_noise`), whose winner is handed to greedy search as the only finite score."""

    def __init__(self, decoding: Decoding, keys: Sequence[str], prompt_valid: torch.Tensor):
        self.decoding, self.keys = decoding, list(keys)
        self.prompt_valid = prompt_valid  # [B, T0] bool: real prompt tokens (left padding excluded)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        d = self.decoding
        scores = scores.float()
        width = self.prompt_valid.shape[1]
        if d.repetition_penalty != 1.0:
            # every real token of the row so far (left padding goes to a spare column, dropped after)
            real = torch.ones_like(input_ids, dtype=torch.bool)
            real[:, :width] = self.prompt_valid
            spare = scores.shape[1]
            seen = torch.zeros(len(scores), spare + 1, dtype=torch.bool, device=scores.device)
            seen = seen.scatter_(1, input_ids.masked_fill(~real, spare), True)[:, :spare]
            penalized = torch.where(scores < 0, scores * d.repetition_penalty, scores / d.repetition_penalty)
            scores = torch.where(seen, penalized, scores)
        if not d.sampled:
            return scores
        probs = torch.softmax(scores / d.temperature, dim=-1)
        # top-p: tokens by descending probability, kept while the mass before them is below top_p
        order = torch.sort(probs, dim=-1, descending=True)
        before = order.values.cumsum(-1) - order.values
        kept = torch.zeros_like(probs).scatter_(1, order.indices, (before < d.top_p).to(probs.dtype))
        step = input_ids.shape[1] - width
        noise = torch.stack([race_noise(d.seed, k, step, probs.shape[1], probs.device) for k in self.keys])
        token = (probs * kept / noise).argmax(dim=-1, keepdim=True)
        return torch.full_like(scores, float("-inf")).scatter_(1, token, 0.0)
