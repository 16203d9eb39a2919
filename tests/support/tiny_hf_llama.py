"""Run by the build environment's Python (torch, transformers): a tiny random-weight Llama and a
byte-level BPE tokenizer trained here on a few sentences, saved as Hugging Face saves them
(nothing downloaded), with what transformers itself computes for a sample text: its token
ids and the next-token logits, for the converted GGUF to be checked against.

    .venv-build/bin/python tests/support/tiny_hf_llama.py OUT_FOLDER
"""

import json
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

out = Path(sys.argv[1])
TEXT = (
    "The quick brown fox jumps over the lazy dog. A language model on a small board answers "
    "questions about the weather, the time and the news. 0123456789 "
) * 20
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
bpe = Tokenizer(models.BPE())
bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
bpe.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(
    vocab_size=400,
    special_tokens=SPECIAL,
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False,
)
bpe.train_from_iterator([TEXT], trainer)
template = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
tokenizer = PreTrainedTokenizerFast(
    tokenizer_object=bpe,
    bos_token="<|im_start|>",
    eos_token="<|im_end|>",
    unk_token=None,
    pad_token="<|endoftext|>",
)
tokenizer.chat_template = template
torch.manual_seed(0)
shape = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
heads = {"num_attention_heads": 4, "num_key_value_heads": 2}
config = LlamaConfig(vocab_size=bpe.get_vocab_size(), **shape, **heads)
config.max_position_embeddings, config.rms_norm_eps, config.tie_word_embeddings = 512, 1e-5, False
config.bos_token_id, config.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
model = LlamaForCausalLM(config).eval()
with torch.no_grad():
    for p in model.parameters():
        p.mul_(8.0)  # sharper logits than the default init, so the argmax is not a near-tie
model.save_pretrained(out, safe_serialization=True)
tokenizer.save_pretrained(out)
sample = "The quick brown fox, 42 answers."
ids = tokenizer(sample, add_special_tokens=False)["input_ids"]
with torch.no_grad():
    logits = model(torch.tensor([ids])).logits[0, -1].tolist()
(out / "reference.json").write_text(json.dumps({"text": sample, "ids": ids, "logits": logits}))
