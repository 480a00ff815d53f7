"""A word-level stand-in tokenizer: weights are random, so text only has to round-trip ids.

Token id i is the word ``w<i>``; any other word maps to a stable hash id. Decoding joins words
with a leading space, so the cumulative text of a stream grows by one word per token.
"""

from __future__ import annotations

import re
import zlib

_WORD = re.compile(r"w(\d+)$")


class WordTokenizer:
    def __init__(self, vocab_size: int, num_special: int = 2):
        self.vocab_size = vocab_size
        self.num_special = num_special
        self._max_digits = len(str(vocab_size - 1))

    def encode(self, text: str) -> list[int]:
        ids = []
        for word in text.split():
            m = _WORD.match(word)
            # digits are measured before int(): Python refuses to convert over 4,300 of them
            digits = m.group(1).lstrip("0") or "0" if m else ""
            if m and len(digits) <= self._max_digits and int(digits) < self.vocab_size:
                ids.append(int(digits))
            else:
                span = self.vocab_size - self.num_special
                ids.append(self.num_special + zlib.crc32(word.encode()) % span)
        return ids

    def decode(self, ids: list[int]) -> str:
        return "".join(f" w{i}" for i in ids)
