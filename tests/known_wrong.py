"""Known-wrong build exercises: each build written out with switches for the mistakes students make.

With every switch at its default the function is right (and the checker must accept it); each switch in
``MISTAKES`` gives one realistic wrong version, which the checker must reject with the feedback fragment listed
beside it. These live with the tests, not in the package: the package holds no solution, right or wrong.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from course.models.llama import rope


def greedy_decode(model, prompt: Tensor, n_new: int, grouping: str = "interleave", scale: bool = True,
                   rotate_keys: bool = True, self_attend: bool = True) -> tuple[Tensor, Tensor]:
    """Notebook 01's build and its typical mistakes: ``grouping="repeat"``
    gives query head h the KV head h % H_kv; no ``scale``; keys cached without rotation; the new token
    not attending to itself (attending to the cache before appending, itself only when it is empty)."""
    cfg = model.config
    h, hkv, d, theta = cfg.n_head, cfg.n_kv_head, cfg.head_dim, cfg.rope_theta
    b = prompt.shape[0]
    keys, values = [None] * cfg.n_layer, [None] * cfg.n_layer
    ids, rows = prompt, []
    for t in range(prompt.shape[1] + n_new - 1):
        pos = torch.full((b, 1), t)
        x = model.tok_emb(ids[:, t : t + 1])  # [B, 1, D]
        for i, block in enumerate(model.blocks):
            attn, z = block.attn, block.norm1(x)
            q = rope(attn.q(z).view(b, 1, h, d).transpose(1, 2), pos, theta)  # [B, H, 1, d]
            k = attn.k(z).view(b, 1, hkv, d).transpose(1, 2)  # [B, H_kv, 1, d]
            k = rope(k, pos, theta) if rotate_keys else k
            v = attn.v(z).view(b, 1, hkv, d).transpose(1, 2)
            old_k, old_v = keys[i], values[i]
            keys[i] = k if old_k is None else torch.cat([old_k, k], dim=2)
            values[i] = v if old_v is None else torch.cat([old_v, v], dim=2)
            seen_k, seen_v = (keys[i], values[i]) if self_attend or old_k is None else (old_k, old_v)
            spread = (lambda x: x.repeat_interleave(h // hkv, 1)) if grouping == "interleave" else \
                (lambda x: x.repeat(1, h // hkv, 1, 1))
            scores = q @ spread(seen_k).transpose(-1, -2) / (math.sqrt(d) if scale else 1.0)  # [B, H, 1, t+1]
            y = torch.softmax(scores, dim=-1) @ spread(seen_v)  # [B, H, 1, d]
            x = x + attn.o(y.transpose(1, 2).reshape(b, 1, h * d))
            x = x + block.mlp(block.norm2(x))
        logits = model.lm_head(model.norm(x))[:, -1]  # [B, vocab]
        rows.append(logits)
        if t >= prompt.shape[1] - 1:
            ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
    return ids, torch.stack(rows, dim=1)


def stream_nll(model, ids: Tensor, window: int, n_sink: int, slack: int = 0, pin: bool = True,
                shift: int = 1) -> Tensor:
    """``window_stream_nll`` and its typical mistakes: ``slack=1`` lets the cache reach window + n_sink + 1
    slots (the new token not counted), ``pin=False`` keeps the last n_sink + window tokens (sinks evicted),
    ``shift=0`` scores the token just fed instead of the next one."""
    b, kv = ids.shape[0], model.config.n_kv_head
    cache = model.new_cache(batch=b)
    budget = n_sink + window
    nll = []
    for t in range(ids.shape[1] - 1):
        n = cache.layers[0].length
        if n >= budget + slack:  # the new token needs a slot: drop the oldest non-sink token
            first = n_sink if pin else 0
            keep = torch.cat([torch.arange(first), torch.arange(n - (budget - first) + 1 - slack, n)])
            for layer in cache.layers:
                layer.gather(keep.expand(b, kv, keep.numel()))
        logits = model(ids[:, t : t + 1], cache=cache).logits[:, -1].double()  # [B, vocab]
        target = ids[:, t + shift : t + shift + 1]
        nll.append(torch.logsumexp(logits, -1) - logits.gather(-1, target)[:, 0])
    return torch.stack(nll, dim=1)


def rolling_step(state, q, k, v, t, n_sink, window, theta, slots: str = "ring", rule: str = "ranks",
                  query: str = "rank"):
    """``rolling_step`` and its typical mistakes: ``slots="modulo"`` cycles through every slot (sinks
    overwritten); ``rule="original"`` rotates keys by their original position, ``rule="slots"`` by their slot
    index; ``query="original"`` rotates the query by t."""
    b, hkv, _, d = k.shape
    size = n_sink + window
    if state is None:
        state = {"k": k.new_zeros(b, hkv, size, d), "v": v.new_zeros(b, hkv, size, d),
                 "pos": torch.full((size,), -1, dtype=torch.long)}
    slot = (t if t < size else n_sink + (t - n_sink) % window) if slots == "ring" else t % size
    state["k"][:, :, slot], state["v"][:, :, slot], state["pos"][slot] = k[:, :, 0], v[:, :, 0], t
    n = min(t + 1, size)
    pos, keys, values = state["pos"][:n], state["k"][:, :, :n], state["v"][:, :, :n]
    key_pos = {"ranks": pos.argsort().argsort(), "original": pos, "slots": torch.arange(n)}[rule]
    q_pos = torch.full((b, 1), n - 1 if query == "rank" else t)
    kr, qr = rope(keys, key_pos.expand(b, n), theta), rope(q, q_pos, theta)
    g = q.shape[1] // hkv  # query heads per KV head
    scores = qr @ kr.repeat_interleave(g, 1).transpose(-1, -2) / d**0.5  # [B, H, 1, n]
    return torch.softmax(scores, dim=-1) @ values.repeat_interleave(g, 1), state


def h2o_step(state, q, k, v, t, budget, recent, theta, group: str = "neighbours", protect: bool = True,
              carry: bool = True, mean: bool = False):
    """``h2o_step`` and its typical mistakes: ``group="first"`` scores a KV head by its group's first query head
    only, ``group="strided"`` sums heads h, h + H_kv, ...; ``protect=False`` may evict the recent tokens;
    ``carry=False`` drops the victim from k, v, pos but not its score (the scores slide onto other slots);
    ``mean=True`` ranks by the mean attention per query that saw a slot (the h2o-mean variant)."""
    b, hkv, _, d = k.shape
    h = q.shape[1]
    g = h // hkv
    new_pos = torch.full((b, hkv, 1), t, dtype=torch.long)
    if state is None:
        state = {"k": k, "v": v, "pos": new_pos, "score": k.new_zeros(b, hkv, 1)}
    else:
        if state["pos"].shape[-1] >= budget:
            rank = state["score"] / (t - state["pos"]).clamp(min=1) if mean else state["score"]
            if protect:
                rank = rank.masked_fill(state["pos"] >= t - recent, float("inf"))
            victim = rank.argmin(dim=-1, keepdim=True)  # [B, H_kv, 1]
            slots = torch.arange(state["pos"].shape[-1]).expand(b, hkv, -1)
            keep = slots[slots != victim].reshape(b, hkv, -1)  # every slot but the victim, in order
            for name in ("k", "v"):
                state[name] = state[name].gather(2, keep[..., None].expand(-1, -1, -1, d))
            state["pos"] = state["pos"].gather(2, keep)
            state["score"] = state["score"].gather(2, keep) if carry else state["score"][..., : keep.shape[-1]]
        state = {"k": torch.cat([state["k"], k], 2), "v": torch.cat([state["v"], v], 2),
                 "pos": torch.cat([state["pos"], new_pos], 2),
                 "score": torch.cat([state["score"], k.new_zeros(b, hkv, 1)], 2)}
    keys = rope(state["k"], state["pos"], theta).repeat_interleave(g, 1)  # [B, H, S, d]
    qr = rope(q, torch.full((b, 1), t), theta)
    w = torch.softmax(qr @ keys.transpose(-1, -2) / d**0.5, dim=-1)  # [B, H, 1, S]
    per_head = w[:, :, 0]  # [B, H, S]
    if group == "neighbours":
        received = per_head.reshape(b, hkv, g, -1).sum(2)
    elif group == "strided":
        received = per_head.reshape(b, g, hkv, -1).sum(1)
    else:
        received = per_head.reshape(b, hkv, g, -1)[:, :, 0]
    state["score"] = state["score"] + received
    return w @ state["v"].repeat_interleave(g, 1), state


def snapkv_compress(model, prompt, capacity, window, kernel, pooling="max", votes="prefix", group="neighbours",
                     keep_window=True):
    """``snapkv_compress`` and its typical mistakes: ``votes="all"`` lets the window vote for its own keys too
    (they then take places of the prefix's and are kept twice), ``group="strided"`` averages heads h, h + H_kv, ...,
    ``keep_window=False`` keeps the ``capacity`` best prefix keys and drops the window."""
    b, p = prompt.shape
    h, hkv = model.config.n_head, model.config.n_kv_head
    cache = model.new_cache(batch=b)
    out = model(prompt, cache=cache, output_attentions=True)
    n_prefix = p - window if votes == "prefix" else p
    for layer, attn in zip(cache.layers, out.attentions):
        v = attn[:, :, -window:, :n_prefix].double().sum(dim=2)  # [B, H, P - w]: the window's votes
        if pooling != "none":  # "none": the checker's mistake of skipping the pooling
            pool = F.max_pool1d if pooling == "max" else \
                (lambda x, k, s, pad: F.avg_pool1d(x, k, s, pad, count_include_pad=False))
            v = pool(v.reshape(b * h, 1, n_prefix), kernel, 1, kernel // 2).reshape(b, h, n_prefix)
        v = v.reshape(b, hkv, h // hkv, n_prefix).mean(2) if group == "neighbours" else \
            v.reshape(b, h // hkv, hkv, n_prefix).mean(1)  # [B, H_kv, P - w]
        if not keep_window:
            keep = v.topk(capacity, dim=-1).indices
        else:  # with votes="all" the window's keys compete for the prefix's places (and come back twice)
            best = v.topk(capacity - window, dim=-1).indices
            keep = torch.cat([best, torch.arange(p - window, p).expand(b, hkv, window)], dim=-1)
        layer.gather(keep.sort(dim=-1).values)
    return cache


def sink_layer(x, layer, sink: str = "per_head", mask: str = "before", scale: bool = True, heads: str = "split"):
    """``sink_attention_layer`` and its typical mistakes: ``sink="shared"`` uses head 0's logit in every head,
    ``sink="none"`` leaves the empty slot out; ``mask="after"`` zeroes the future's weights after the softmax;
    ``scale=False`` skips 1/sqrt(d); ``heads="reshape"`` reshapes [B, T, D] straight to [B, H, T, d]."""
    b, t, dm = x.shape
    h = layer.n_head
    d = dm // h
    q, k, v = layer.qkv(x).split(dm, dim=-1)
    if heads == "split":
        q, k, v = (z.view(b, t, h, d).transpose(1, 2) for z in (q, k, v))  # [B, H, T, d]
    else:
        q, k, v = (z.reshape(b, h, t, d) for z in (q, k, v))
    scores = q @ k.transpose(-1, -2) / (d**0.5 if scale else 1.0)  # [B, H, T, T]
    future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
    if mask == "before":
        scores = scores.masked_fill(future, float("-inf"))
    logit = layer.sink_logit if sink == "per_head" else layer.sink_logit[:1].expand(h)
    if sink == "none":
        w = torch.softmax(scores, dim=-1)
    else:
        w = torch.softmax(torch.cat([scores, logit.view(1, h, 1, 1).expand(b, h, t, 1)], dim=-1), dim=-1)[..., :-1]
    if mask == "after":
        w = w.masked_fill(future, 0.0)
    return layer.out((w @ v).transpose(1, 2).reshape(b, t, dm))


def gated_layer(x, layer, gate_from: str = "x", gate_at: str = "before_out", squash: bool = True,
                heads: str = "split", mask: str = "before"):
    """``gated_attention_layer`` and its typical mistakes: ``gate_from="y"`` reads the gate from the attention's
    output, ``gate_at="after_out"`` gates after the projection, ``gate_at="none"`` forgets it, ``squash=False``
    skips the sigmoid, ``heads="reshape"`` merges [B, H, T, d] by a plain reshape, ``mask="after"`` zeroes the
    future's weights after the softmax."""
    b, t, dm = x.shape
    h = layer.n_head
    d = dm // h
    q, k, v = (z.view(b, t, h, d).transpose(1, 2) for z in layer.qkv(x).split(dm, dim=-1))
    scores = q @ k.transpose(-1, -2) / d**0.5
    future = torch.ones(t, t, dtype=torch.bool).triu(1)
    weights = torch.softmax(scores.masked_fill(future, float("-inf")) if mask == "before" else scores, dim=-1)
    if mask == "after":
        weights = weights.masked_fill(future, 0.0)
    y = (weights @ v).transpose(1, 2).reshape(b, t, dm) if heads == "split" else (weights @ v).reshape(b, t, dm)
    gate = layer.gate(x if gate_from == "x" else y)
    gate = torch.sigmoid(gate) if squash else gate
    if gate_at == "after_out":
        return layer.out(y) * gate
    return layer.out(y) if gate_at == "none" else layer.out(y * gate)


def _variant(impl, **switches):
    if impl is snapkv_compress:  # the checker passes pooling positionally; a mistake may replace it
        return lambda m, p, c, w, k, pooling="max": impl(m, p, c, w, k, **{"pooling": pooling, **switches})
    return lambda *args: impl(*args, **switches)


def kivi_settle(keys: Tensor, values: Tensor, positions: Tensor, done: int, next_position: int, bits: int, group: int,
                residual: int, key_axis: str = "channel", early: int = 0,
                use_residual: bool = True) -> tuple[Tensor, Tensor, int]:
    """Notebook 08's build and its typical mistakes: keys rounded per token (``key_axis="token"``); a group rounded
    ``early`` tokens before it leaves the residual (negative: after); the residual ignored."""
    levels = 2**bits - 1

    def round_trip(x: Tensor, low: Tensor, high: Tensor) -> Tensor:
        step = ((high - low) / levels).nan_to_num(0.0)
        step = torch.where(step > 0, step, torch.ones_like(step))
        return ((x - low) / step).round().clamp(0, levels) * step + low

    def per_token(x: Tensor) -> Tensor:
        b, h, s, d = x.shape
        g = x.reshape(b, h, s, d // group, group)
        return round_trip(g, g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)).reshape(b, h, s, d)

    while done + group <= next_position - (residual if use_residual else 0) + early:
        inside = ((positions >= done) & (positions < done + group))[..., None]
        if key_axis == "channel":
            low = keys.masked_fill(~inside, math.inf).amin(dim=2, keepdim=True)
            high = keys.masked_fill(~inside, -math.inf).amax(dim=2, keepdim=True)
            rounded = round_trip(keys, low, high)
        else:
            rounded = per_token(keys)
        keys.copy_(torch.where(inside, rounded, keys))
        values.copy_(torch.where(inside, per_token(values), values))
        done += group
    return keys, values, done


def retrieval_scores(model, trials, shift: int = 1, span: bool = True, token: bool = True, divide: str = "answer",
                     average: bool = True) -> Tensor:
    """Notebook 09's build and its typical mistakes: the row of the answer token itself read (``shift=0``); any key
    with the token counted, inside the needle or not (``span=False``); any needle key counted, whatever its token
    (``token=False``); hits divided by the needle's length (``divide="needle"``); trials summed, not averaged."""
    total = 0.0
    for trial in trials:
        ids = torch.cat([trial.prompt[0], trial.answer])
        maps = model(ids[None], output_attentions=True).attentions
        first, (lo, hi) = trial.prompt.shape[1], trial.needle
        hits = torch.zeros(len(maps), maps[0].shape[1], dtype=torch.float64)
        for layer, attn in enumerate(maps):
            for i in range(first, ids.shape[0]):
                top = attn[0, :, i - shift].argmax(-1)
                inside = (top >= lo) & (top < hi) if span else torch.ones_like(top, dtype=torch.bool)
                same = ids[top] == ids[i] if token else torch.ones_like(top, dtype=torch.bool)
                hits[layer] += (inside & same).double()
        total = total + hits / ((ids.shape[0] - first) if divide == "answer" else (hi - lo))
    return total / len(trials) if average else total


# exercise id -> (the build with its switches, [(switches, a fragment of the feedback it must get)])
MISTAKES = {
    "01.greedy_own_attention": (greedy_decode, [
        (dict(grouping="repeat"), "repeat_interleave the KV heads"),
        (dict(scale=False), "the scores are wrong"),
        (dict(rotate_keys=False), "the scores are wrong"),
        (dict(self_attend=False), "*before* attending"),
    ]),
    "02.window_stream_nll": (stream_nll, [
        (dict(slack=1), "n_sink + window + 1 keys"),
        (dict(pin=False), "never evicted"),
        (dict(shift=0), "score the *next* token"),
    ]),
    "03.rolling_step": (rolling_step, [
        (dict(slots="modulo"), "a sink slot was overwritten"),
        (dict(rule="original"), "once the cache has filled"),
        (dict(rule="slots"), "slot order is not token order"),
        (dict(query="original"), "the query's rank"),
    ]),
    "04.h2o_decode": (h2o_step, [
        (dict(group="first"), "sum the group"),
        (dict(group="strided"), "sum the group"),
        (dict(protect=False), "the recent window is protected"),
        (dict(carry=False), "the scores move with their slots"),
        (dict(mean=True), "rank by the running sums themselves"),
    ]),
    "05.snapkv_compress": (snapkv_compress, [
        (dict(votes="all"), "vote for the prefix keys only"),
        (dict(group="strided"), "average neighbouring heads"),
        (dict(keep_window=False), "keep the observation window itself"),
        (dict(pooling="none"), "pool the votes along the keys"),
    ]),
    "06.sink_attention_layer": (sink_layer, [
        (dict(sink="shared"), "its own sink logit"),
        (dict(sink="none"), "append each head's sink logit"),
        (dict(mask="after"), "mask the future before the softmax"),
        (dict(scale=False), "1/sqrt(d)"),
        (dict(heads="reshape"), "view(B, T, H, d).transpose(1, 2)"),
    ]),
    "06.gated_attention_layer": (gated_layer, [
        (dict(gate_at="none"), "the gate is missing"),
        (dict(gate_from="y"), "computed from the layer's input x"),
        (dict(gate_at="after_out"), "between the attention and the output projection"),
        (dict(squash=False), "with a sigmoid"),
        (dict(heads="reshape"), "transpose(1, 2).reshape(B, T, D)"),
        (dict(mask="after"), "mask the future before the softmax"),
    ]),
    "08.kivi_settle": (kivi_settle, [
        (dict(key_axis="token"), "keys are rounded per channel"),
        (dict(early=1), "one token too early"),
        (dict(early=-1), "one token too long"),
        (dict(use_residual=False), "the newest `residual` tokens stay in full precision"),
    ]),
    "09.retrieval_scores": (retrieval_scores, [
        (dict(shift=0), "read row i - 1"),
        (dict(span=False), "only a key inside the needle counts"),
        (dict(token=False), "the very token being produced"),
        (dict(divide="needle"), "by the number of answer tokens"),
        (dict(average=False), "average over the trials"),
    ]),
}
CASES = [(e, i) for e in MISTAKES for i in range(len(MISTAKES[e][1]))]
WRONG_BUILD = {e: [(_variant(impl, **switches), fragment) for switches, fragment in mistakes]
               for e, (impl, mistakes) in MISTAKES.items()}
