"""Generation through a compressed cache: sampling, stopping, bounded memory, the chat and the CLI."""

from __future__ import annotations

import json

import pytest
import torch

from course.__main__ import main
from course.generate import Chat, Sampler, generate, sample_batch
from course.policies import make_policy

from tests.conftest import tiny_model


class CharTokenizer:
    """A tokenizer of the tiny models' 97-symbol vocabulary: id i is chr(32 + i); no end-of-sequence token."""

    eos_token_id = None
    chat_template = None

    def __call__(self, text, return_tensors=None, add_special_tokens=True):
        ids = [min(ord(c) - 32, 96) % 97 for c in text]
        return type("Encoding", (), {"input_ids": torch.tensor([ids]) if return_tensors == "pt" else ids})()

    def decode(self, ids):
        return "".join(chr(32 + int(i)) for i in ids)


def test_greedy_generation_is_argmax_decoding_through_the_cache():
    model, tok = tiny_model("llama"), CharTokenizer()
    steps = list(generate(model, tok, "the sink", make_policy("full"), max_new_tokens=6))
    ids = tok("the sink", return_tensors="pt").input_ids
    with torch.no_grad():
        for step in steps:  # each token is the argmax of a fresh full forward over everything so far
            assert step.token == int(model(ids).logits[0, -1].argmax())
            ids = torch.cat([ids, torch.tensor([[step.token]])], dim=1)
    assert "".join(s.text for s in steps) == tok.decode(ids[0, 8:])


def test_sampling_is_repeatable_with_a_seed_and_differs_across_seeds():
    model, tok = tiny_model("gpt2"), CharTokenizer()
    policy = lambda: make_policy("streaming", 16, model=model)  # noqa: E731
    a = [s.token for s in generate(model, tok, "abc", policy(), max_new_tokens=40, temperature=1.5, seed=3)]
    b = [s.token for s in generate(model, tok, "abc", policy(), max_new_tokens=40, temperature=1.5, seed=3)]
    c = [s.token for s in generate(model, tok, "abc", policy(), max_new_tokens=40, temperature=1.5, seed=4)]
    assert a == b and a != c


def test_top_p_keeps_only_the_nucleus():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    drawn = {Sampler(1.0, top_p=0.7, seed=s)(logits) for s in range(200)}
    assert drawn == {0, 1}  # 0.5 + 0.3 reach 0.7: the other two are never drawn
    assert Sampler(0.0)(logits) == 0


@pytest.mark.parametrize("scale", [0.1, 1.0, 8.0])  # flat (the nucleus holds thousands of tokens) to peaked
def test_nucleus_from_the_top_tokens_is_the_nucleus_of_the_whole_sort(scale):
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        probs = torch.softmax(scale * torch.randn(5000, generator=g), -1)
        sampler = Sampler(1.0, top_p=0.9)
        top, ids = sampler._top_mass(probs)
        sorted_p, order = probs.sort(descending=True)
        whole = set(order[(sorted_p.cumsum(0) - sorted_p) < 0.9].tolist())
        assert set(ids[(top.cumsum(0) - top) < 0.9].tolist()) == whole


@pytest.mark.parametrize("bad", [dict(temperature=-1.0), dict(top_p=0.0), dict(top_p=1.5), dict(seed=-1),
                                 dict(seed=2**64), dict(temperature="hot")])
def test_bad_sampling_values_are_refused(bad):
    with pytest.raises(ValueError, match="temperature|top_p|seed"):
        Sampler(**bad)


def test_generating_four_times_the_cache_keeps_memory_bounded(family):
    model, tok = tiny_model(family, max_positions=512), CharTokenizer()
    budget = 32
    steps = list(generate(model, tok, "a prompt longer than nothing", make_policy("streaming", budget, model=model),
                          max_new_tokens=4 * budget))
    assert len(steps) == 4 * budget
    assert max(s.cache_slots for s in steps) == budget
    assert max(s.cache_bytes for s in steps) == budget * model.cache_bytes_per_token


def test_generation_refuses_to_run_past_gpt2_positions():
    model, tok = tiny_model("gpt2", max_positions=64), CharTokenizer()
    with pytest.raises(ValueError, match="the prompt \\+ max_new_tokens needs 70 token positions"):
        generate(model, tok, "0123456789", max_new_tokens=60)


def test_a_chat_keeps_one_bounded_cache_across_turns():
    model, tok = tiny_model("llama"), CharTokenizer()
    chat = Chat(model, tok, make_policy("streaming", 24, model=model), max_new_tokens=10)
    for text in ("hello there", "and again", "one more"):
        answer = "".join(s.text for s in chat.say(text))
        assert chat.turns[-1].assistant in answer
    assert len(chat.turns) == 3 and all(t.cache_slots <= 24 for t in chat.turns)
    assert chat.seen > 24  # the conversation outgrew the cache
    with pytest.raises(ValueError, match="non-empty"):
        list(chat.say("   "))


@pytest.mark.slow
def test_generate_and_chat_on_smollm2_from_the_command_line(capsys, tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("It is a truth universally acknowledged, that a single man in possession of a good fortune,")
    argv = ["generate", "--prompt-file", str(prompt), "--policy", "streaming", "--budget", "16",
            "--max-new-tokens", "64", "--temperature", "0.8", "--seed", "7", "--ignore-eos", "--json"]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert main(argv) == 0
    second = json.loads(capsys.readouterr().out)
    assert first["text"] == second["text"] and first["new_tokens"] == 64, "a seed gives the same text"
    assert first["max_cache_bytes"] == 16 * 2 * 30 * 3 * 64 * 4  # 16 slots while generating 4x the cache
    script = tmp_path / "turns.txt"
    script.write_text("What is the capital of France?\n\nName a colour.\n")
    assert main(["chat", "--script", str(script), "--budget", "64", "--max-new-tokens", "12", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [t["user"] for t in out["turns"]] == ["What is the capital of France?", "Name a colour."]
    assert all(a.strip() for a in out["answers"]) and out["max_cache_bytes"] <= 64 * 2 * 30 * 3 * 64 * 4
    assert main(["chat", "--json"]) == 2
    assert "--json needs --script" in capsys.readouterr().err


def test_fluency_sees_repetition_and_scores_with_the_full_context():
    from course.generate import fluency

    model = tiny_model("llama", dtype=torch.float32)
    prompt = torch.randint(0, 97, (1, 10))
    loop = fluency(model, prompt, [5, 6, 7, 8] * 6)
    varied = fluency(model, prompt, list(range(10, 34)))
    assert loop["distinct"] == pytest.approx(4 / 21) and varied["distinct"] == 1.0
    ids = torch.cat([prompt, torch.tensor([list(range(10, 34))])], dim=1)
    with torch.no_grad():
        nll = torch.nn.functional.cross_entropy(model(ids).logits[0, 9:-1], ids[0, 10:])
    assert varied["ppl_full_context"] == pytest.approx(float(nll.exp()), rel=1e-4)


def test_generation_stops_at_the_end_of_sequence_unless_told_to_ignore_it():
    model, tok = tiny_model("llama"), CharTokenizer()
    first = next(iter(generate(model, tok, "abc", max_new_tokens=1))).token
    tok.eos_token_id = first  # the model's first greedy token now ends the text at once
    assert list(generate(model, tok, "abc", max_new_tokens=8)) == []
    assert len(list(generate(model, tok, "abc", max_new_tokens=8, ignore_eos=True))) == 8


def test_a_batch_of_prompts_generates_what_each_prompt_generates_alone(family):
    model, tok = tiny_model(family), CharTokenizer()
    prompts = torch.cat([tok(p, return_tensors="pt").input_ids for p in ("the sink", "a window", "recent!!")])
    for temperature in (0.0, 1.2):  # greedy, and sampled with seed + row
        new, cache = sample_batch(model, prompts, make_policy("streaming", 12, model=model), max_new_tokens=20,
                                  temperature=temperature, seed=5)
        assert new.shape == (3, 20) and cache.n_slots == 12
        for b in range(3):
            alone = [s.token for s in generate(model, tok, prompts[b : b + 1], make_policy("streaming", 12, model=model),
                                               max_new_tokens=20, temperature=temperature, seed=5 + b)]
            assert new[b].tolist() == alone
    with pytest.raises(ValueError, match=r"prompts must be ids of shape \[B, P\]"):
        sample_batch(model, prompts[0], None, max_new_tokens=2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        sample_batch(model, prompts, None, max_new_tokens=0)
