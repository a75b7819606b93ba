"""Random-weight checkpoints of a known shape, for measurements where weights do not matter.

`write_checkpoint(dest, shape, dtype)` writes an HF Llama checkpoint (config, safetensors
weights drawn with a fixed seed, generation config) and a small byte-level BPE tokenizer
trained on a built-in text, with a ChatML template and `<|im_end|>` as end of turn: a
directory `argosy serve --model DIR` and `AutoModelForCausalLM.from_pretrained` both take.
Nothing is downloaded. Shapes: `smollm2-135m` (the catalog model's exact architecture,
about 135M parameters) and `tiny` (two layers, for tests). The tokenizer's vocabulary is
smaller than the model's, so every id it makes is valid for the model.

    write_checkpoint(Path("/tmp/smol-random"), "smollm2-135m", "bfloat16")
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from argosy.core.errors import ArgosyError

SHAPES: dict[str, dict[str, Any]] = {
    "smollm2-135m": {
        "vocab_size": 49152,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "max_position_embeddings": 8192,
        "rope_theta": 100000.0,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
    },
    "tiny": {
        "vocab_size": 1024,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 1024,
        "tie_word_embeddings": True,
    },
}
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_TOKENIZER_VOCAB = 600
_TEXT = (
    "The harbour at Kestrel Point was built in 1871 to shelter the herring fleet. Its granite "
    "breakwater runs four hundred metres to the north-east and ends in a small white lighthouse. "
    "def mean(values):\n    total = 0\n    for value in values:\n        total += value\n"
    "    return total / len(values)\n"
    "Summarize the report, answer the question, repeat the list, write a short story about a "
    "ship, a cluster of accelerators, a checkpoint, a training run and a served model. "
    "0123456789 ,.;:!?()[]{}<>-+=*/'\"\n"
)


def write_checkpoint(dest: Path, shape: str = "smollm2-135m", dtype: str = "bfloat16") -> Path:
    """Write the checkpoint and tokenizer into `dest` (created) and return it."""
    import torch
    import transformers

    if shape not in SHAPES:
        raise ArgosyError(f"unknown shape '{shape}': use one of {', '.join(SHAPES)}")
    dest.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer()
    config = transformers.LlamaConfig(
        **SHAPES[shape],
        bos_token_id=tokenizer.convert_tokens_to_ids("<|im_start|>"),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(getattr(torch, dtype)).eval()
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    return dest


def _tokenizer() -> Any:
    """A byte-level BPE trained on `_TEXT`, wrapped for transformers with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_TOKENIZER_VOCAB,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator([_TEXT] * 4, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped
