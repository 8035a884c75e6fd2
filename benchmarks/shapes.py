"""Random-weight models of real architectures' shapes (from_config: no download), for GPU benchmarks."""

from __future__ import annotations

import zlib

SHAPES = {
    "llama-3.2-1b": (
        "llama",
        dict(
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
            vocab_size=128256,
            rope_theta=500000.0,
            tie_word_embeddings=True,
            max_position_embeddings=4096,
        ),
    ),
    "llama-3-8b": (
        "llama",
        dict(
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            vocab_size=128256,
            rope_theta=500000.0,
            max_position_embeddings=4096,
        ),
    ),
    "qwen3-8b": (
        "qwen3",
        dict(
            hidden_size=4096,
            intermediate_size=12288,
            num_hidden_layers=36,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=151936,
            max_position_embeddings=4096,
        ),
    ),
    "qwen3-32b": (  # 32.8B parameters, 65.5 GB in bf16: one H100/H200
        "qwen3",
        dict(
            hidden_size=5120,
            intermediate_size=25600,
            num_hidden_layers=64,
            num_attention_heads=64,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=151936,
            tie_word_embeddings=False,
            max_position_embeddings=4096,
        ),
    ),
    "tiny": (  # anywhere, CPU included: the benchmarks' own smoke test
        "llama",
        dict(
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=1000,
            max_position_embeddings=4096,  # a rubric prompt in the byte-level stand-in tokenizer: ~1500 ids
        ),
    ),
}


def dims(shape: str):
    """The memory plan's dimensions of a shape (truthflow.memplan.Dims)."""
    from truthflow.memplan import Dims

    return Dims.of(SHAPES[shape][1])


class IdTokenizer:
    """A stand-in tokenizer: ids 0-2 are pad, eos and bos; each word of a text (whitespace-split) becomes one
    id in 3..999 (a hash: the same word, the same id), about as many tokens as a BPE tokenizer gives an
    English question. Decoding writes the ids as numbers."""

    pad_token_id = 0
    eos_token_id = 1
    bos_token_id = 2
    chat_template = None

    def __init__(self, vocab_size: int = 1000):
        self.vocab_size = vocab_size  # the model's: the ids `save_pretrained` writes

    def save_pretrained(self, folder) -> None:
        """Tokenizer files a loader reads (AutoTokenizer's, vLLM's) for a model saved beside them: one token
        per id of the model's vocabulary, written as its number (as `decode` writes it), pad, eos and bos
        as here. A text they encode word by word, not by this class's hash: give such a loader ids."""
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast

        words = Tokenizer(models.WordLevel({str(i): i for i in range(self.vocab_size)}, unk_token="0"))
        words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        fast = PreTrainedTokenizerFast(tokenizer_object=words, pad_token="0", eos_token="1", bos_token="2")
        fast.save_pretrained(folder)

    def __call__(self, text: str, add_special_tokens: bool = True):
        ids = [3 + zlib.crc32(word.encode()) % 997 for word in text.split()]
        return {"input_ids": [self.bos_token_id, *ids] if add_special_tokens else ids}

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))

    def get_vocab(self):  # no id decodes to a newline: the newline stop adds none
        return {}

    @property
    def backend_tokenizer(self):  # the newline stop (generation.newline_token_ids) decodes with it
        return self

    def decode_batch(self, batch, skip_special_tokens=False):
        return [self.decode(ids) for ids in batch]


def random_model(shape: str, dtype: str = "bfloat16", device: str | None = None, attention: str = "auto"):
    """A LoadedModel with random weights of the named shape, the stand-in tokenizer (`IdTokenizer`) and the
    engine's attention setting (truthflow.engine.backend)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from truthflow.models import LoadedModel

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model_type, kwargs = SHAPES[shape]
    config = AutoConfig.for_model(model_type, **kwargs)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.eval()

    info = {"n_layers": config.num_hidden_layers, "hidden_size": config.hidden_size, "chat": False}
    tokenizer = IdTokenizer(config.vocab_size)
    return LoadedModel(model=model, tokenizer=tokenizer, info=info, device=device, attention=attention)
