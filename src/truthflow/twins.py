"""Tiny random-weight twins of the real architectures for exactness tests, with the traits that change the
math: Llama-3's rope scaling, Mistral's sliding window, Qwen3's q/k norms and tied head, Gemma-3's layer mix,
scaled embeddings and soft-cap, Mixtral's 2-of-4 experts. Tokenizer: a byte-level stand-in, or a real one."""

import json
from pathlib import Path

import torch

from .prepared import INFO_FILE, LoadedModel

ARCHS = ("llama", "gemma3", "mistral", "qwen3", "mixtral")
WINDOW = 8  # Gemma-3 / Mistral sliding window (tokens): every test sequence crosses it
SPECIAL = [
    # the byte-level stand-in's own pad/BOS/EOS
    "<pad>",
    "<bos>",
    "<eos>",
    # the turn tokens of every family's chat template: Qwen3, Gemma-3, Mistral/Mixtral, Llama-3
    "<|im_start|>",
    "<|im_end|>",
    "<start_of_turn>",
    "<end_of_turn>",
    "[INST]",
    "[/INST]",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]
THINK = ["<think>", "</think>"]  # plain added tokens, as in Qwen3 (decoded like text)
TEMPLATES = {
    "llama": "{{ bos_token }}<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant."
    "<|eot_id|>{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}"
    "<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n"
    "{% endif %}",
    "gemma3": "{{ bos_token }}{% for m in messages %}<start_of_turn>"
    "{{ 'model' if m.role == 'assistant' else m.role }}\n{{ m.content }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}",
    "mistral": "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content }} [/INST]"
    "{% else %}{{ m.content }}{{ eos_token }}{% endif %}{% endfor %}",
    # Mixtral-8x7B-Instruct's layout: [INST] turns that must alternate user/assistant, so a system turn raises
    "mixtral": "{{ bos_token }}{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if m.role == 'user' %}[INST] {{ m.content }} [/INST]"
    "{% else %}{{ m.content }}{{ eos_token }}{% endif %}{% endfor %}",
    # Qwen3-like: enable_thinking (default true) opens a reasoning block; false writes an empty closed one
    "qwen3": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}"
    "<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endif %}",
}
# the token that ends an assistant turn, a stop token beside EOS (None: the family ends a turn with EOS)
TURN_END = {
    "llama": "<|eot_id|>",
    "gemma3": "<end_of_turn>",
    "mistral": None,
    "qwen3": "<|im_end|>",
    "mixtral": None,
}
# a real tokenizer in a family's layout: its template's turn tokens, BOS/EOS/pad unless its own (None: no BOS)
FAMILY = {
    "llama": {
        "turn": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        "bos": "<|begin_of_text|>",
        "eos": "<|end_of_text|>",
        "pad": "<|end_of_text|>",
    },
    "mistral": {"turn": ["[INST]", "[/INST]"]},
    "qwen3": {
        "turn": ["<|im_start|>", "<|im_end|>"],
        "bos": None,
        "eos": "<|im_end|>",
        "pad": "<|endoftext|>",
    },
    "gemma3": {"turn": ["<start_of_turn>", "<end_of_turn>"]},
    "mixtral": {"turn": ["[INST]", "[/INST]"]},
}
# Qwen3's twin: its </think> row (tied: logit and embedding) x this, so that the rehearsal's greedy answers
# close a block now and then (with heads of 32 dims: 1 of its 8 HotpotQA answers at 4 and 4.5, none at 3.5)
THINK_SCALE = 4.0


def build_tokenizer(arch: str):
    """One token per byte (GPT-2's byte alphabet, no merges) plus the special tokens of every family."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {s: i for i, s in enumerate([*SPECIAL, *bytes_to_unicode().values()])}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL)
    tok.add_tokens(THINK)
    bos = None if arch == "qwen3" else "<bos>"  # Qwen3 writes no BOS
    if bos:
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=bos,
        eos_token="<eos>",
        pad_token="<pad>",
        chat_template=TEMPLATES[arch],
        model_max_length=4096,
    )


def adapt_tokenizer(arch: str, tok):
    """A real tokenizer in `arch`'s layout (in place): FAMILY's missing tokens, BOS, chat template."""
    from tokenizers import processors

    fam = FAMILY[arch]
    vocab = tok.get_vocab()
    named = dict.fromkeys(fam["turn"] + [fam.get(k) for k in ("bos", "eos", "pad")])
    tok.add_tokens([t for t in named if t and t not in vocab], special_tokens=True)
    if arch == "qwen3":
        tok.add_tokens([t for t in THINK if t not in vocab])
    for key in ("bos", "eos", "pad"):
        if key in fam:
            setattr(tok, f"{key}_token", fam[key])
    if "bos" in fam:  # the family's own BOS on a plain encoding (base prompts), or none
        bos = fam["bos"]
        if bos:
            single, special = f"{bos} $A", [(bos, tok.convert_tokens_to_ids(bos))]
        else:
            single, special = "$A", []
        tok.backend_tokenizer.post_processor = processors.TemplateProcessing(single, special_tokens=special)
    tok.chat_template = TEMPLATES[arch]
    return tok


def build_config(arch: str, vocab_size: int, ids: dict, **overrides):
    """`ids`: the tokenizer's pad/bos/eos token ids."""
    import transformers as tf

    if arch not in ARCHS:
        raise ValueError(f"unknown twin architecture '{arch}'; one of {ARCHS}")
    # Llama-3's rope scaling; an original context of 64 tokens puts the twin's four rotary frequencies on
    # both sides of the cut (wavelength 6 kept, 167 and longer divided by `factor`)
    llama_rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    # each family's config class and the settings that carry its traits
    family_configs = {
        "llama": (tf.LlamaConfig, dict(num_hidden_layers=3, rope_parameters=llama_rope)),
        "mistral": (tf.MistralConfig, dict(num_hidden_layers=2, sliding_window=WINDOW)),
        "qwen3": (
            tf.Qwen3Config,
            dict(num_hidden_layers=3, rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
        ),
        # no sliding window, as Mixtral-8x7B's config; 4 experts, 2 per token, as 8 and 2 in the real model
        "mixtral": (
            tf.MixtralConfig,
            dict(num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
        ),
        "gemma3": (
            tf.Gemma3TextConfig,
            dict(
                num_hidden_layers=3,
                sliding_window=WINDOW,
                layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                final_logit_softcapping=3.0,
                attn_logit_softcapping=5.0,
                query_pre_attn_scalar=32,
            ),
        ),
    }
    config_class, own = family_configs[arch]
    # the dims every twin shares: small, with grouped-query heads (4 query heads over 2 key/value heads) of
    # 32 dims, the smallest head vLLM's CPU attention runs (the rehearsal's answers go through vLLM)
    cfg = config_class(
        vocab_size=vocab_size,
        max_position_embeddings=4096,
        initializer_range=0.2,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        tie_word_embeddings=arch in ("qwen3", "gemma3"),
        **ids,
        **own,
    )
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


def build_twin(
    arch: str, *, tokenizer=None, dtype=torch.float32, seed=0, attn_implementation="sdpa", **overrides
) -> LoadedModel:
    """A seeded random-weight twin of `arch` on the CPU (global RNG untouched); overrides: config attrs."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    tok = build_tokenizer(arch) if tokenizer is None else adapt_tokenizer(arch, tokenizer)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    ids = {"pad_token_id": pad_id, "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}
    cfg = build_config(arch, len(tok), ids, **overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn_implementation)
    cfg.architectures = [type(model).__name__]
    if tokenizer is not None and arch == "qwen3":
        with torch.no_grad():
            model.get_output_embeddings().weight[tok.convert_tokens_to_ids(THINK[1])] *= THINK_SCALE
    model = model.to(dtype).eval()
    turn = [tok.convert_tokens_to_ids(TURN_END[arch])] if TURN_END[arch] else []
    stop_ids = list(dict.fromkeys([cfg.eos_token_id, *turn]))
    model.generation_config = GenerationConfig(
        bos_token_id=cfg.bos_token_id, eos_token_id=stop_ids, pad_token_id=cfg.pad_token_id, do_sample=False
    )
    info = {
        "name": f"twin-{arch}",
        "architecture": cfg.architectures[0],
        "model_type": cfg.model_type,
        "n_layers": cfg.num_hidden_layers,
        "hidden_size": cfg.hidden_size,
        "key": {"twin": arch, "seed": seed},
    }
    return LoadedModel(model=model, tokenizer=tok, info=info, device="cpu")


def save_twin(arch: str, out_dir: str | Path, *, tokenizer=None, seed: int = 0, **overrides) -> Path:
    """Write a twin as a prepared model directory (config, safetensors, tokenizer, info file)."""
    out = Path(out_dir)
    lm = build_twin(arch, tokenizer=tokenizer, seed=seed, **overrides)
    lm.model.save_pretrained(out)
    lm.tokenizer.save_pretrained(out)
    (out / INFO_FILE).write_text(json.dumps(lm.info, indent=2))
    return out
