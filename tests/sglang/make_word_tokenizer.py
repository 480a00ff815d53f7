"""Write a Hugging Face tokenizer directory equivalent to the bundled server's word tokenizer.

    .venv-sglang/bin/python tests/sglang/make_word_tokenizer.py OUT_DIR [VOCAB_SIZE]

Token id i <-> the word ``w<i>`` (systems/engine/tokenizer.py), words split on whitespace, no
special tokens added: SGLang's bench_serving can then count and build prompts offline, and its
retokenized output count equals the server's. Needs ``tokenizers`` and ``transformers`` (both in
.venv-sglang). Declaring an eos/unk *special* token is avoided on purpose: special tokens are
matched inside words, so "w1" would split "w101".
"""

from __future__ import annotations

import sys


def main(out_dir: str, vocab_size: int = 512) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab={f"w{i}": i for i in range(vocab_size)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(out_dir)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 512)
