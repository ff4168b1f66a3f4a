"""Makes tests/data/tokenizer.json: a tiny byte-level BPE tokenizer with DeepSeek's special
tokens, for the serve tests (the real DeepSeek tokenizer is ~8 MB and not needed to test the
counting). Run: pip install tokenizers && python3 tests/data/make_tokenizer.py

The merges come from a few sentences of the twin's placeholder vocabulary, so token counts of
those words are small and stable; any text still tokenizes (byte fallback via byte-level BPE).
Special tokens, each one token: BOS/EOS, <｜User｜>, <｜Assistant｜>, <think>, </think>, and the
tool-call markers. The post-processor prepends BOS, as DeepSeek's tokenizer does."""

import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

SPECIAL = [
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<think>",
    "</think>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁outputs▁begin｜>",
    "<｜tool▁outputs▁end｜>",
    "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>",
]

CORPUS = [
    "the twin predicts each step of a deployment on ascend dies",
    "while experts route tokens across the fabric and decode streams answers to clients",
    "in time with prefill caches blocks for reuse",
    "tell me about the fabric hello hi be brief what is the weather",
] * 20


def main() -> None:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    bos = SPECIAL[0]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))]
    )
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tokenizer.json")
    tok.save(out)
    print(out, tok.get_vocab_size(), tok.encode("the twin predicts each step").tokens)


if __name__ == "__main__":
    main()
