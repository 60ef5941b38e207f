"""The course's own readable models, with weights copied from transformers.

    from course.models import load_model
    model, tokenizer = load_model("smollm2-135m", device="cpu")

Names: ``gpt2`` (124M, learned positions; Hugging Face hub), ``smollm2-135m`` (Llama family,
RoPE + GQA; offline from the course cache, see ``course.assets``), ``gpt2-random`` (GPT-2's
architecture and shapes with random weights, offline: the course checks its GPT-2 code paths on it),
and ``auto``: gpt2 when it is cached or the hub is reachable, else smollm2-135m. Any other name is a
Hugging Face checkpoint (hub id or local folder) of a supported architecture: GPT-2, Llama, Mistral
or Qwen2 (e.g. ``meta-llama/Llama-2-7b-hf`` on a GPU, to compare with the papers' numbers).
"""

from __future__ import annotations

import os

import torch
from torch import nn

from course.model_names import MODEL_NAMES, check_model_name
from course.models.base import CausalLM, ModelConfig, ModelOutput
from course.models.family import FAMILIES, family, family_of_hf
from course.models.gpt2 import GPT2  # each family's file registers it
from course.models.llama import Llama
from course.progress import library_bars

__all__ = [
    "CausalLM", "ModelConfig", "ModelOutput", "GPT2", "Llama", "FAMILIES", "MODEL_NAMES", "gpt2_random",
    "load_model", "load_hf_model", "from_transformers", "config_from_hf", "build_model", "resolve_device",
]

GPT2_HUB_ID = "openai-community/gpt2"
SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """'auto' -> cuda if available, else cpu. Any explicit device is checked."""
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was requested but no CUDA GPU is available; use device='cpu' or 'auto'")
    return dev


def build_model(cfg: ModelConfig) -> CausalLM:
    """An (untrained) course model for a config: the model class of its family."""
    return family(cfg.family).model(cfg)


def config_from_hf(hf_config, name: str = "model") -> ModelConfig:
    """Translate a transformers config into a course ``ModelConfig``, by its family (``course.models.family``).

    Refuses, with the reason, what the course's models do not implement (e.g. RoPE scaling, sliding-window
    attention layers) and model types no family loads."""
    return family_of_hf(hf_config.model_type).config_from_hf(hf_config, name)


def from_transformers(hf_model: nn.Module, name: str = "model") -> CausalLM:
    """Build the course model with the weights of a transformers GPT-2 or Llama model."""
    cfg = config_from_hf(hf_model.config, name)
    with torch.device("meta"):  # no random initialisation (seconds on a CPU): every weight is copied below
        model = build_model(cfg)
    mapped = family(cfg.family).weights_from_hf(hf_model.state_dict(), cfg)
    first = next(hf_model.parameters())
    model = model.to_empty(device=first.device).to(first.dtype)
    if cfg.tie_embeddings:  # to_empty gives every parameter its own storage: tie the output to the embedding again
        model.lm_head.weight = model.tok_emb.weight
    missing, unexpected = model.load_state_dict(mapped, strict=False)  # copies into the model: no clone needed
    missing = [m for m in missing if not (cfg.tie_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"weight copy incomplete: missing {missing}, unexpected {unexpected}")
    return model.eval()


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")


def gpt2_available() -> tuple[bool, str]:
    """Is gpt2 usable here (cached, or hub reachable)? Returns (yes/no, why)."""
    try:
        from huggingface_hub import try_to_load_from_cache
        cached = try_to_load_from_cache(GPT2_HUB_ID, "config.json")
        if isinstance(cached, str):
            return True, "found in the Hugging Face cache"
    except Exception:  # pragma: no cover - depends on the hub library
        pass
    if _hub_offline():
        return False, "not cached and HF_HUB_OFFLINE is set"
    import urllib.request
    try:
        urllib.request.urlopen(f"https://huggingface.co/api/models/{GPT2_HUB_ID}", timeout=3).close()
        return True, "the Hugging Face hub is reachable"
    except OSError:
        return False, "not cached and the Hugging Face hub is not reachable"


def load_hf_model(name: str, dtype: torch.dtype = torch.float32, attn: str = "eager"):
    """The transformers model and tokenizer behind a course model name or a hub checkpoint (parity checks:
    ``attn="eager"``; speed comparisons: ``attn="sdpa"``). A checkpoint's config is checked before its
    weights are downloaded."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from course import assets

    if name == "gpt2":
        ok, why = gpt2_available()
        if not ok:
            raise assets.AssetMissing(f"gpt2 is not available here ({why}); it comes from the Hugging Face "
                                      "hub only. Offline, use model='smollm2-135m' (after `python -m course fetch`).")
        src = GPT2_HUB_ID
    elif name == "smollm2-135m":
        if assets.smollm2_dir().exists() or _hub_offline():  # fetched (even if damaged: say so, never fall back)
            src = str(assets.require("smollm2-135m"))
        else:  # online and not fetched: the original weights from the hub
            src = SMOLLM2_HUB_ID
    elif name in MODEL_NAMES:
        raise ValueError(f"{name!r} has no transformers counterpart; load it with load_model({name!r})")
    else:
        src = name
    try:
        if name not in MODEL_NAMES:
            config_from_hf(AutoConfig.from_pretrained(src), name)  # refuse an unsupported model before the download
        with library_bars():  # no frozen "Loading weights" bar in an executed notebook
            tok = AutoTokenizer.from_pretrained(src)
            hf = AutoModelForCausalLM.from_pretrained(src, dtype=dtype, attn_implementation=attn)
    except OSError as e:
        hint = {"smollm2-135m": "run `python -m course fetch` for the offline copy",
                "gpt2": "gpt2 comes from the Hugging Face hub only; offline, use model='smollm2-135m'"}.get(
            name, f"model must be one of {', '.join(MODEL_NAMES)}, or a Hugging Face checkpoint (hub id or folder) "
                  "of a GPT-2, Llama, Mistral or Qwen2 model")
        raise assets.AssetMissing(f"cannot load {name} from {src}: {e}\n{hint}") from e
    return hf.eval(), tok


def gpt2_random(seed: int = 0, tiny: bool = False):
    """GPT-2 small's architecture and shapes (12 layers, 12 heads, width 768, 1024 learned positions,
    LayerNorm, biases) with random weights (GPT-2's initialisation), and SmolLM2's tokenizer (GPT-2's own is
    on the hub only). Untrained: it has no attention sink. Returns (model, tokenizer).

    ``tiny=True`` (``gpt2-tiny-random``): the same code paths at 4 layers, 4 heads of 32, width 128: every
    notebook runs end to end through GPT-2's code in seconds (the class-grading test's kernels)."""
    from transformers import AutoTokenizer

    from course import assets

    tok = AutoTokenizer.from_pretrained(str(assets.require("smollm2-135m")))
    layers, heads, width = (4, 4, 128) if tiny else (12, 12, 768)
    cfg = ModelConfig(family="gpt2", vocab_size=len(tok), n_layer=layers, n_head=heads, n_kv_head=heads,
                      d_model=width, head_dim=width // heads, d_ff=4 * width, max_positions=1024, norm_eps=1e-5,
                      name="gpt2-tiny-random" if tiny else "gpt2-random", random_weights=True)
    return build_model(cfg).init_weights(seed).eval(), tok


def load_model(name: str = "auto", device: str | torch.device = "auto", dtype: torch.dtype = torch.float32,
               verbose: bool = True):
    """Load a course model and its tokenizer: ``model, tokenizer = load_model("smollm2-135m")``.

    ``name``: one of ``MODEL_NAMES`` or a Hugging Face checkpoint of a supported architecture."""
    check_model_name(name)
    dev = resolve_device(device)
    if name == "auto":
        ok, why = gpt2_available()
        name = "gpt2" if ok else "smollm2-135m"
        if verbose:
            print(f"model='auto' picked {name} (gpt2 {why})")
    if name in ("gpt2-random", "gpt2-tiny-random"):
        model, tok = gpt2_random(tiny=name == "gpt2-tiny-random")
        return model.to(dev, dtype), tok
    hf, tok = load_hf_model(name, dtype)
    model = from_transformers(hf, name).to(dev)
    del hf
    return model, tok
