"""Train the byte-level BPE tokenizer of the embedded model family on the stdlib training files.

python models/recipes/train_tokenizer.py --out runs/tokenizer --vocab-size 4096
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from mlxspec.drafting.lookup.corpus import read_text, split_files  # noqa: E402

EOS = "<|endoftext|>"


def train_tokenizer(vocab_size: int, texts: list[str] | None = None, show_progress: bool = True) -> Tokenizer:
    """The byte-level BPE on `texts` (default: the stdlib training files); tests train small ones on a few files."""
    if texts is None:
        train_files, _ = split_files()
        texts = [t for t in (read_text(p) for p in train_files) if t is not None]
    tok = Tokenizer(models.BPE())
    # GPT-2 style byte-level pre-tokenization: lossless, and keeps "newline + indent" runs together.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=show_progress,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tok


def save(tok: Tokenizer, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": EOS,
        "eos_token": EOS,
        "unk_token": EOS,
        "pad_token": EOS,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 512,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": EOS, "eos_token": EOS, "unk_token": EOS, "pad_token": EOS}, indent=2) + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/tokenizer"))
    parser.add_argument("--vocab-size", type=int, default=4096)
    args = parser.parse_args()
    tok = train_tokenizer(args.vocab_size)
    save(tok, args.out)
    print(f"saved {tok.get_vocab_size()}-token tokenizer to {args.out}")


if __name__ == "__main__":
    main()
