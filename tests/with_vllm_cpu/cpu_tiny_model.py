"""A tiny random-weight Llama with its own BPE tokenizer, written into a local Hugging Face cache.

Nothing is downloaded: the tokenizer is trained offline on a made-up corpus and the weights are
random (seeded), so the model is the same bytes on every machine. vLLM reads it by repo id from
HF_HUB_CACHE with HF_HUB_OFFLINE=1, as it reads any cached model.

The shape is the smallest vLLM's CPU attention takes: head_dim 32 (its CPU kernels have no
smaller head size), 2 layers, 2 KV heads, fp32. Run as a script: `python cpu_tiny_model.py
HF_HUB_CACHE` (the test fixture runs it so that torch is never imported into pytest itself).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

REPO_ID = "activekv/tiny-llama"
# A fixed snapshot name (the "commit" of the cached repo); refs/main points at it.
REVISION = "0" * 40
# The words of the training corpus and of the prompts (cpu_workload.py): every prompt word is one
# of them, so the tokenizer has short merges for all of them.
WORDS = (
    "the cache block token prefix engine offload layer host device store load hit miss step "
    "model prompt query value key"
).split()


def snapshot_dir(hub_cache: Path) -> Path:
    return hub_cache / f"models--{REPO_ID.replace('/', '--')}" / "snapshots" / REVISION


def write_model(hub_cache: Path) -> Path:
    """Writes the model's snapshot and refs/main under `hub_cache`; the snapshot folder."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = snapshot_dir(hub_cache)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    corpus = [" ".join(rng.choice(WORDS) for _ in range(30)) for _ in range(2000)]
    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(corpus, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>")
    tokenizer.save_pretrained(out)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=4096,
        bos_token_id=0,
        eos_token_id=1,
        torch_dtype="float32",
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)
    refs = out.parent.parent / "refs"
    refs.mkdir(exist_ok=True)
    (refs / "main").write_text(REVISION)
    return out


if __name__ == "__main__":
    print(write_model(Path(sys.argv[1])))
