"""The model a checker hands to a student's function: the course's model, minus the shortcuts the exercise is
about, counting the work it is asked to do.

``GuardedModel`` (a context manager) wraps a course model for one check:

* it counts, per layer, how many key rows the model projects (a forward hook on each layer's key projection, so
  every route counts: ``model(...)``, ``model.forward(...)``, the blocks' parts): a cached decode projects each
  token's key exactly once, a recomputation projects the prefix again at every step;
* it records how many tokens each forward call got (a streaming loop feeds one);
* ``new_cache`` makes plain caches only (no policy: the policy is what a build writes; ``policies=True`` where the
  exercise is about something else), and a forward refuses a cache it did not make or whose policy was changed;
* with ``whole_forward=False`` the whole forward and every block's and attention module's own forward are refused:
  the build writes the attention, with the parts (``tok_emb``, ``blocks[i].attn.q``/``k``/``v``/``o``, norms,
  MLPs, ``lm_head``), whose weights it cannot read or change.

A refusal raises ``Refused`` inside the student's function, with a message that names the shortcut. Under the
autograder these objects stay in the grader's process: the kernel only calls them.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from course.policies import FullCache

__all__ = ["GuardedModel", "Part", "Refused"]

_PLAIN = ("config", "device", "dtype")


class Refused(RuntimeError):
    """A shortcut the checker's model does not allow (the message says which, and what to do instead)."""


def _key_projection(block: nn.Module) -> nn.Module:
    attn = block.attn
    return attn.k if hasattr(attn, "k") else attn.qkv  # Llama: its own W_K; GPT-2: W_Q, W_K, W_V side by side


def _is_attention_or_block(module: nn.Module) -> bool:
    return hasattr(module, "attn") or hasattr(module, "qkv") or (hasattr(module, "q") and hasattr(module, "k"))


class Part:
    """A sub-module a build may call but not read the weights of, change, or (for a block or an attention module)
    run whole."""

    __slots__ = ("_module", "_name")

    def __init__(self, module: nn.Module, name: str) -> None:
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "_name", name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _is_attention_or_block(self._module):
            raise Refused(f"{self._name}(...) runs the course's own attention: write the attention yourself from the "
                          "parts (attn.q, attn.k, attn.v, attn.o, the norms, the MLP)")
        return self._module(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        child = getattr(self._module, name)
        if isinstance(child, nn.ModuleList):
            return [Part(m, f"{self._name}.{name}[{i}]") for i, m in enumerate(child)]
        if isinstance(child, nn.Module):
            return Part(child, f"{self._name}.{name}")
        if isinstance(child, Tensor):
            raise AttributeError(f"{self._name}.{name} is not readable here: call the module instead")
        if callable(child):
            raise AttributeError(f"{self._name}.{name} is not available here: call the module itself")
        return child

    def __len__(self) -> int:
        return len(self._module)

    def __repr__(self) -> str:
        return f"<{self._name}: callable part of the course's model>"


class GuardedModel:
    """See the module. ``key_rows[l]``: key rows layer ``l`` projected (all batch rows); ``calls``: tokens per
    forward call; ``caches``: the caches ``new_cache`` made."""

    def __init__(self, model: nn.Module, whole_forward: bool = True, policies: bool = False, name: str = "model"
                 ) -> None:
        self._model, self._whole, self._policies, self._name = model, whole_forward, policies, name
        self.key_rows = [0] * len(model.blocks)
        self.calls: list[int] = []
        self.caches: list[Any] = []
        self._hooks = [_key_projection(block).register_forward_hook(self._counter(i))
                       for i, block in enumerate(model.blocks)]

    def _counter(self, layer: int):
        def count(module: nn.Module, args: tuple, out: Tensor) -> None:
            self.key_rows[layer] += int(args[0].shape[:-1].numel())

        return count

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def __enter__(self) -> GuardedModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------------------- what the student may call
    def __call__(self, ids: Tensor, *args: Any, cache: Any = None, **kwargs: Any) -> Any:
        if not self._whole:
            raise Refused(f"{self._name}(...) is the course's whole forward pass: write it yourself from the parts "
                          "(model.tok_emb, model.blocks[i].attn.q/k/v/o, norm1, norm2, mlp, model.norm, "
                          "model.lm_head)")
        if cache is not None and not any(cache is made for made in self.caches):
            raise Refused("use a cache made by model.new_cache(batch=...) for this model")
        if cache is not None and not self._policies and type(cache.policy) is not FullCache:
            raise Refused(f"the cache's policy was changed to {cache.policy!r}: keep the cache plain and choose what "
                          "to keep yourself (layer.gather)")
        self.calls.append(int(ids.shape[-1]))
        return self._model(ids, *args, cache=cache, **kwargs)

    forward = __call__

    def new_cache(self, batch: int = 1, policy: Any = None, *args: Any, **kwargs: Any) -> Any:
        """A plain cache (every token kept until you evict it); a policy is refused: it is what you build."""
        if not self._whole:
            raise Refused("keep your own keys and values per layer (lists of tensors), not the course's cache")
        if policy is not None and not self._policies and type(policy) is not FullCache:
            raise Refused(f"model.new_cache(policy={policy!r}) runs the course's own policy, which is what this "
                          "exercise asks you to write: make a plain cache (model.new_cache(batch=B)) and choose "
                          "what it keeps yourself")
        cache = self._model.new_cache(batch, policy, *args, **kwargs)
        self.caches.append(cache)
        return cache

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in _PLAIN:
            return getattr(self._model, name)
        if self._whole:
            raise AttributeError(f"{self._name}.{name} is not available in this exercise: call model(...) and "
                                 "model.new_cache(...)")
        child = getattr(self._model, name)
        if isinstance(child, nn.ModuleList):
            return [Part(m, f"{self._name}.{name}[{i}]") for i, m in enumerate(child)]
        if isinstance(child, nn.Module):
            return Part(child, f"{self._name}.{name}")
        raise AttributeError(f"{self._name}.{name} is not available in this exercise: use the model's parts")

    # ----------------------------------------------------------------------------- what the checker reads
    def projected_per_token(self, batch: int, tokens: int) -> list[float]:
        """Key rows projected per layer, per batch row and per token fed (exactly 1.0 for a cached decode)."""
        return [rows / (batch * tokens) for rows in self.key_rows]

    def __repr__(self) -> str:
        return f"<the course's {self._model.config.name}, as this exercise allows it>"
