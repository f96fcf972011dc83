"""The demo model `blink generate` uses when no --model is given: tiny, random, but real in every format.

A small Llama with random weights from a fixed seed, a byte-level BPE tokenizer trained (with HF
`tokenizers`) on a short English text below, a chat template and a generation config. It is written
deterministically into <cache>/demo-model on first use, where <cache> is $BLINK_CACHE or ~/.cache/blink.
Its output is gibberish, but every code path of a real checkpoint is exercised.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

DEMO_VERSION = "1"  # bump when anything below changes, so stale caches are rebuilt
BOS, EOS, EOT = "<|begin_of_text|>", "<|end_of_text|>", "<|eot|>"
HEADER_START, HEADER_END = "<|start_header|>", "<|end_header|>"
SPECIAL_TOKENS = [BOS, EOS, HEADER_START, HEADER_END, EOT]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|start_header|>{{ message['role'] }}<|end_header|>\n\n{{ message['content'] }}<|eot|>"
    "{% endfor %}{% if add_generation_prompt %}<|start_header|>assistant<|end_header|>\n\n{% endif %}"
)
TRAINING_TEXT = """\
Hello! How are you today? I am fine, thank you. What would you like to talk about?
The quick brown fox jumps over the lazy dog. A small cat sleeps in the warm sun by the window.
Once upon a time, in a village near the mountains, there lived an old baker who made bread every morning.
The people of the village loved his bread, and children came to the shop to smell the fresh loaves.
Water boils at one hundred degrees Celsius at sea level, and it freezes at zero degrees.
The sun is a star. The earth moves around the sun once a year, and the moon moves around the earth.
Plants use light from the sun to make sugar from water and air. This is called photosynthesis.
Computers store numbers in binary, using only zeros and ones. A program is a list of instructions.
To make a cup of tea, boil some water, pour it over the leaves, and wait for three or four minutes.
The train leaves the station at nine in the morning and arrives in the city before noon.
She opened the door, looked outside, and saw that it was raining again. She took her umbrella.
Good morning! Could you help me find the library? Of course, it is just around the corner.
What is the capital of France? The capital of France is Paris. Paris is known for its museums.
Numbers: one, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve, twenty, hundred.
Days of the week: Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday.
Months: January, February, March, April, May, June, July, August, September, October, November, December.
A good question deserves a careful answer. Please explain your reasoning step by step.
The model reads the prompt, predicts the next token, and repeats until it reaches the end.
Music can make people happy or sad. Some like to sing, others like to dance or play the piano.
The river flows from the hills to the sea. Fish swim in the river, and birds fly above the water.
In the garden there are roses, tulips and apple trees. In autumn the leaves turn red and yellow.
He wrote a letter to his friend and told her about his new job, his new house and his new dog.
Thank you very much for your help. You are welcome. Have a nice day! See you tomorrow.
Learning a language takes time and practice. Read every day, write a little, and speak often.
The doctor said that sleep, good food and exercise are important for a long and healthy life.
Scientists observe the world, ask questions, make predictions and test them with experiments.
Yes, no, maybe. Why? Because. Where? Here and there. When? Now, later, soon, never, always.
The history of the city goes back two thousand years, to a small market on the bank of the river.
"""


def cache_dir() -> Path:
    return Path(os.environ.get("BLINK_CACHE") or Path.home() / ".cache" / "blink")


def build_tokenizer(vocab_size: int = 1024) -> Tokenizer:
    """A byte-level BPE trained on TRAINING_TEXT: any text round-trips, common words are single tokens."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tokenizer.train_from_iterator(TRAINING_TEXT.splitlines(keepends=True), trainer=trainer)
    return tokenizer


def write_tokenizer_files(tokenizer: Tokenizer, out_dir: Path, model_max_length: int = 2048) -> dict:
    """tokenizer.json + tokenizer_config.json (with the chat template); returns the special token ids."""
    tokenizer.save(str(out_dir / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOT,
        "pad_token": EOS,
        "chat_template": CHAT_TEMPLATE,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    return {name: tokenizer.token_to_id(name) for name in SPECIAL_TOKENS}


def demo_config(vocab_size: int, bos_token_id: int, eos_token_ids: list[int]) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_ids,
    }


def random_llama_tensors(hf: dict, seed: int, std: float = 0.02) -> dict[str, torch.Tensor]:
    """HF-named random Llama weights (norms 1) for the shapes of config dict `hf`."""
    hidden, inter, vocab = hf["hidden_size"], hf["intermediate_size"], hf["vocab_size"]
    q_size = hf["num_attention_heads"] * hf["head_dim"]
    kv_size = hf["num_key_value_heads"] * hf["head_dim"]
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    for i in range(hf["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (hidden,),
            p + "self_attn.q_proj.weight": (q_size, hidden),
            p + "self_attn.k_proj.weight": (kv_size, hidden),
            p + "self_attn.v_proj.weight": (kv_size, hidden),
            p + "self_attn.o_proj.weight": (hidden, q_size),
            p + "post_attention_layernorm.weight": (hidden,),
            p + "mlp.gate_proj.weight": (inter, hidden),
            p + "mlp.up_proj.weight": (inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter),
        }
    if not hf["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (vocab, hidden)
    generator = torch.Generator().manual_seed(seed)
    return {
        name: torch.ones(shape) if name.endswith("norm.weight")
        else torch.randn(shape, generator=generator) * std
        for name, shape in shapes.items()
    }


def build_demo_model(out_dir: Path, seed: int = 0) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    ids = write_tokenizer_files(tokenizer, out_dir)
    eos_ids = [ids[EOT], ids[EOS]]
    hf = demo_config(tokenizer.get_vocab_size(), ids[BOS], eos_ids)
    (out_dir / "config.json").write_text(json.dumps(hf, indent=2))
    generation = {"bos_token_id": ids[BOS], "eos_token_id": eos_ids}
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2))
    save_file(random_llama_tensors(hf, seed), str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "blink_demo_version").write_text(DEMO_VERSION)


def _is_current(model_dir: Path) -> bool:
    marker = model_dir / "blink_demo_version"
    return marker.is_file() and marker.read_text() == DEMO_VERSION


def ensure_default_model() -> Path:
    """The demo model's directory, built on first use (atomically: concurrent first uses are safe)."""
    target = cache_dir() / "demo-model"
    if _is_current(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="demo-model-", dir=target.parent))
    try:
        build_demo_model(staging)
        if not _is_current(target):  # absent, or an older version: replace it
            shutil.rmtree(target, ignore_errors=True)
            try:
                staging.rename(target)
            except OSError:  # another process finished first; its copy is identical
                pass
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
