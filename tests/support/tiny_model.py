"""Build a tiny random-weight Llama plus a locally trained BPE tokenizer.

Nothing can be downloaded from a model hub in CI, so end-to-end tests build
their own model: hidden size 64, 2 layers, 4 heads, a vocabulary of about 1000
byte-level BPE tokens, fixed seeds. The weights are random, so generated text is
gibberish, but it is deterministic and SGLang serves it like any Llama.

Works with transformers 4.57 and 5.x: the model goes through ``save_pretrained``
(safetensors) and the tokenizer files are written by hand in the format both
versions load with ``AutoTokenizer.from_pretrained``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

BOS = "<s>"
EOS = "</s>"
PAD = "<pad>"
UNK = "<unk>"
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK]  # ids 0..3, in this order

TARGET_VOCAB = 1000
SEED = 1234

HIDDEN = 64
LAYERS = 2
HEADS = 4
KV_HEADS = 2
INTERMEDIATE = 128
MAX_POS = 2048

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

_WORDS = (
    "the a an of to and in on for with by from at as is are was were be been "
    "this that these those it its they them their we our you your he she his her "
    "model token tokens draft target verify accept reject speculative decoding "
    "server request batch prefill decode cache radix memory kernel graph tensor "
    "layer head hidden state attention rotary embedding vocabulary sampling "
    "greedy temperature probability logits softmax argmax step steps length "
    "fast slow quick lazy brown fox dog cat bird fish river mountain forest city "
    "road bridge house garden window door table chair book paper letter number "
    "one two three four five six seven eight nine ten hundred thousand million "
    "red green blue yellow black white orange purple silver golden bright dark "
    "run runs running ran walk walks walking jump jumps jumping write writes "
    "writing read reads reading think thinks thinking build builds building "
    "test tests testing check checks checking measure measures measuring gate "
    "policy policies plugin plugins version versions python torch sglang eagle "
    "morning evening night day week month year spring summer autumn winter "
    "question answer reason because however therefore although while until "
    "small large tiny huge short long early late new old good bad happy sad"
).split()


def _corpus(n_sentences: int = 4000) -> list[str]:
    """A deterministic, built-in training corpus (no files, no downloads)."""
    rng = random.Random(SEED)
    lines = [
        "The quick brown fox jumps over the lazy dog.",
        "Speculative decoding drafts tokens and the target model verifies them.",
        "Hello, world! How are you today? I am fine, thank you.",
        "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 100 1000",
        "user: What is the capital of France? assistant: Paris.",
    ]
    punct = [".", ".", ".", "!", "?", ",", ";", ":"]
    for _ in range(n_sentences):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 14))]
        words[0] = words[0].capitalize()
        if rng.random() < 0.2:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 2048)))
        lines.append(" ".join(words) + rng.choice(punct))
    return lines


def _train_tokenizer():
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TARGET_VOCAB,
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A {BOS} $B",
        special_tokens=[(BOS, bos_id)],
    )
    return tok


def _write_tokenizer(tok, dest: Path) -> None:
    tok.save(str(dest / "tokenizer.json"))
    added = {
        str(tok.token_to_id(t)): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t in SPECIAL_TOKENS
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": UNK,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POS,
        "added_tokens_decoder": added,
        "chat_template": CHAT_TEMPLATE,
    }
    (dest / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    special_map = {
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": UNK,
    }
    (dest / "special_tokens_map.json").write_text(
        json.dumps(special_map, indent=2) + "\n"
    )


def build_tiny_llama(dest: Path) -> Path:
    """Write a tiny random Llama and its tokenizer into ``dest``; return ``dest``.

    ``AutoTokenizer.from_pretrained(dest)`` and
    ``AutoModelForCausalLM.from_pretrained(dest)`` both load the result, and
    ``python -m sglang.launch_server --model-path dest`` serves it.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)

    tok = _train_tokenizer()
    _write_tokenizer(tok, dest)

    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=MAX_POS,
        rms_norm_eps=1e-5,
        pad_token_id=tok.token_to_id(PAD),
        bos_token_id=tok.token_to_id(BOS),
        eos_token_id=tok.token_to_id(EOS),
        tie_word_embeddings=False,
    )
    # Fork the RNG so building a model does not disturb the caller's seed.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = LlamaForCausalLM(config).to(torch.float32).eval()
    model.save_pretrained(dest, safe_serialization=True)
    return dest
