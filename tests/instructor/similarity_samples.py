"""Notebook 01 filled in by four students who worked independently (each a correct, ordinary way of writing the
exercises), a copy of one of them disguised (names renamed, comments changed, independent lines reordered), and
the released copy they start from: the data that the similarity report's threshold is chosen from."""

from __future__ import annotations

from pathlib import Path

import nbformat

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
RELEASED = NOTEBOOKS / "student" / "01_kv_cache.ipynb"
SOLUTION = NOTEBOOKS / "01_kv_cache.ipynb"
STUB = "raise NotImplementedError()"

# cell id -> the lines that replace the stub, per student
ANSWERS = {"understanding-q1": "return 36864", "understanding-q2": "return 4", "understanding-q3": 'return "b"',
           "understanding-q4": 'return "c"'}

HONEST = {
    "ada": {
        "cell-05": """
K = torch.vstack((K, k_new.unsqueeze(0)))
V = torch.vstack((V, v_new.unsqueeze(0)))
scores = (K * q).sum(dim=1) / q.numel() ** 0.5
p = scores.softmax(0)
out = (p[:, None] * V).sum(0)
return out, K, V""",
        "cell-12": """
cache = model.new_cache(batch=prompt.shape[0])
out = prompt
nxt = prompt
for step in range(n_new):
    logits = model(nxt, cache=cache).logits
    nxt = logits[:, -1:].argmax(dim=-1)
    out = torch.cat((out, nxt), dim=-1)
return out""",
        "cell-18": """
per_token = n_layers * kv_heads * head_dim * dtype_bytes
return per_token * 2 * tokens * batch""",
        "cell-23b": """
layers = config["n_layers"]
if "kv_lora_rank" in config:
    count = layers * (config["kv_lora_rank"] + config["rope_dim"])
else:
    count = layers * 2 * config["kv_heads"] * config["head_dim"]
if bits == 16:
    return 2 * count
groups = count // group_size
return count * bits // 8 + 4 * groups""",
    },
    "bo": {
        "cell-05": """
keys = torch.cat((K, k_new.reshape(1, -1)), dim=0)
vals = torch.cat((V, v_new.reshape(1, -1)), dim=0)
d = q.shape[0]
logits = keys.matmul(q) / math.sqrt(d)
logits = logits - logits.max()       # stable softmax
w = torch.exp(logits)
w = w / w.sum()
return w.matmul(vals), keys, vals""",
        "cell-12": """
batch = prompt.shape[0]
cache = model.new_cache(batch=batch)
generated = [prompt]
logits = model(prompt, cache=cache).logits[:, -1, :]
for i in range(n_new):
    token = torch.argmax(logits, dim=-1).unsqueeze(-1)
    generated.append(token)
    if i < n_new - 1:
        logits = model(token, cache=cache).logits[:, -1, :]
return torch.cat(generated, dim=1)""",
        "cell-18": """
import math as m
return m.prod([2, n_layers, kv_heads, head_dim, tokens, batch, dtype_bytes])""",
        "cell-23b": """
L = config["n_layers"]
if config.get("kv_lora_rank"):
    per_layer = config["kv_lora_rank"] + config["rope_dim"]
else:
    per_layer = 2 * config["kv_heads"] * config["head_dim"]
total = L * per_layer
if group_size is None or bits == 16:
    return total * 2
n_groups = total // group_size
payload = total * bits / 8
return int(payload) + n_groups * 4""",
    },
    "cyd": {
        "cell-05": """
import torch.nn.functional as F
new_K = torch.concat([K, k_new.view(1, -1)])
new_V = torch.concat([V, v_new.view(1, -1)])
att = F.softmax(torch.einsum("d,td->t", q, new_K) * q.size(-1) ** -0.5, dim=-1)
output = torch.einsum("t,td->d", att, new_V)
return output, new_K, new_V""",
        "cell-12": """
c = model.new_cache(batch=len(prompt))
seq = prompt.clone()
last = model(prompt, cache=c).logits
while seq.shape[1] < prompt.shape[1] + n_new:
    pick = last[:, -1, :].max(dim=-1).indices[:, None]
    seq = torch.hstack([seq, pick])
    last = model(pick, cache=c).logits
return seq""",
        "cell-18": """
elements = kv_heads * head_dim
elements *= n_layers
elements *= tokens * batch
keys_and_values = 2 * elements
return keys_and_values * dtype_bytes""",
        "cell-23b": """
n = config["n_layers"]
mla = "kv_lora_rank" in config
width = config["kv_lora_rank"] + config["rope_dim"] if mla else 2 * config["kv_heads"] * config["head_dim"]
numbers = n * width
bytes_ = numbers * bits / 8
if bits < 16:
    bytes_ += (numbers / group_size) * 4   # fp16 scale + zero point
return int(bytes_)""",
    },
    "dee": {
        "cell-05": """
t = K.shape[0]
K2 = torch.zeros(t + 1, K.shape[1], dtype=K.dtype)
V2 = torch.zeros(t + 1, V.shape[1], dtype=V.dtype)
K2[:t], K2[t] = K, k_new
V2[:t], V2[t] = V, v_new
scale = 1.0 / math.sqrt(len(q))
a = torch.softmax(torch.mv(K2, q) * scale, dim=0)
return torch.mv(V2.T, a), K2, V2""",
        "cell-12": """
state = model.new_cache(batch=prompt.size(0))
result = prompt
inp = prompt
for _ in range(n_new):
    scores = model(inp, cache=state).logits
    best = scores[:, -1].argmax(-1).view(-1, 1)
    result = torch.cat([result, best], 1)
    inp = best
return result""",
        "cell-18": """
total = 1
for factor in (n_layers, kv_heads, head_dim, tokens, batch, dtype_bytes):
    total *= factor
return total * 2   # keys and values""",
        "cell-23b": """
if "kv_lora_rank" not in config:
    floats = config["n_layers"] * config["kv_heads"] * config["head_dim"] * 2
else:
    floats = (config["kv_lora_rank"] + config["rope_dim"]) * config["n_layers"]
if bits != 16:
    scales = floats // group_size
    return floats * bits // 8 + scales * 4
return floats * 2""",
    },
}

# bo's work, disguised: every name renamed, comments changed, independent lines swapped
DISGUISED_BO = {
    "cell-05": """
values_all = torch.cat((V, v_new.reshape(1, -1)), dim=0)
keys_all = torch.cat((K, k_new.reshape(1, -1)), dim=0)
dim = q.shape[0]
s = keys_all.matmul(q) / math.sqrt(dim)
s = s - s.max()   # subtract the max for stability
e = torch.exp(s)
e = e / e.sum()
return e.matmul(values_all), keys_all, values_all""",
    "cell-12": """
bsz = prompt.shape[0]
kv = model.new_cache(batch=bsz)
logit_row = model(prompt, cache=kv).logits[:, -1, :]
pieces = [prompt]
for j in range(n_new):
    tok = torch.argmax(logit_row, dim=-1).unsqueeze(-1)
    pieces.append(tok)
    if j < n_new - 1:
        logit_row = model(tok, cache=kv).logits[:, -1, :]
return torch.cat(pieces, dim=1)""",
    "cell-18": """
import math as mm
return mm.prod([2, n_layers, kv_heads, head_dim, tokens, batch, dtype_bytes])""",
    "cell-23b": """
nl = config["n_layers"]
if config.get("kv_lora_rank"):
    each = config["kv_lora_rank"] + config["rope_dim"]
else:
    each = 2 * config["kv_heads"] * config["head_dim"]
everything = nl * each
if group_size is None or bits == 16:
    return everything * 2
body = everything * bits / 8
groups = everything // group_size
return int(body) + groups * 4""",
}


def filled(work: dict[str, str], extra_cells: tuple[str, ...] = ()) -> nbformat.NotebookNode:
    """The released copy of notebook 01 with each stub of ``work`` (cell id -> lines) and the questions
    answered, and ``extra_cells`` appended."""
    nb = nbformat.read(RELEASED, as_version=4)
    for cell in nb.cells:
        body = {**ANSWERS, **work}.get(cell.get("id"))
        if body is not None and STUB in cell.source:
            indent = "    "
            lines = "\n".join(indent + line if line else line for line in body.strip("\n").split("\n"))
            cell.source = cell.source.replace(indent + STUB, lines)
    nb.cells += [nbformat.v4.new_code_cell(c) for c in extra_cells]
    return nb


def pasted_solution() -> nbformat.NotebookNode:
    """The released copy with every solution region pasted from the course's solution notebook."""
    from course.instructor.solutions import paste_solutions

    return paste_solutions(nbformat.read(RELEASED, as_version=4), nbformat.read(SOLUTION, as_version=4))
