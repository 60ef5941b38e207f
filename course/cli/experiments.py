"""The experiments: ``stream`` (perplexity through a bounded cache), ``needle`` (passkey retrieval after
compressing the prompt), ``generate`` and ``chat``."""

from __future__ import annotations

import argparse

from course.cli.args import (Command, _model_args, _policy_args, _policy_for, positive_int, seed_int,
                             unit_float)


# ----------------------------------------------------------------------------- stream
def _stream_args(p: argparse.ArgumentParser) -> None:
    from course.policies import policy_names

    _model_args(p)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--corpus", default="austen", help="austen (default), pg19 or wikitext")
    src.add_argument("--text-file", help="a local UTF-8 text file (only its first --tokens tokens are read)")
    p.add_argument("--book", default=None, help="with --corpus austen: one novel, e.g. pride_and_prejudice")
    _policy_args(p, policy_names(streams=True), "streaming", 1024)  # SnapKV only compresses a prompt: see `needle`
    p.add_argument("--tokens", type=positive_int, default=2048)
    p.add_argument("--passages", type=positive_int, default=None,
                   help="measure over N >= 2 passages of --tokens tokens from all six novels (openings, then "
                        "mid-text): the spread instead of one number")
    p.add_argument("--seed", type=seed_int, default=0, help="with --passages: which passages (default 0)")
    p.add_argument("--method", choices=["auto", "exact", "decode"], default="auto",
                   help="exact chunked evaluator (default) or the token-by-token decode loop")
    p.add_argument("--json", action="store_true")


def _check_text_source(args: argparse.Namespace) -> None:
    """Check --text-file / --corpus / --book before the model loads (cheap)."""
    from course.assets import AUSTEN_BOOKS, require
    from course.data import CORPORA, check_text_file

    if args.text_file is not None:
        check_text_file(args.text_file, "--text-file")
        if args.book is not None:
            raise ValueError("--book goes with --corpus austen, not with --text-file")
        return
    if args.corpus not in CORPORA:
        raise ValueError(f"--corpus must be one of {', '.join(CORPORA)} (or use --text-file PATH), got {args.corpus!r}")
    if args.corpus == "austen":
        if args.book is not None and args.book not in AUSTEN_BOOKS.values():
            raise ValueError(f"--book must be one of {', '.join(AUSTEN_BOOKS.values())}; got {args.book!r}")
        require("austen")


def _stream_ids(args: argparse.Namespace, tok, device):
    """The first --tokens token ids of the chosen text; a text file is read only as far as needed."""
    from course.data import load_text, tokenize, tokenize_file

    if args.text_file is not None:
        return tokenize_file(tok, args.text_file, args.tokens, device, label="--text-file")
    return tokenize(tok, load_text(args.corpus, args.book), args.tokens, device)


def _stream(args: argparse.Namespace) -> dict:
    from course.models import load_model
    from course.policies import POLICIES
    from course.streaming import evaluate_stream

    budget = args.budget if POLICIES[args.policy].bounded else None
    _policy_for(args, args.budget)  # bad values: refused before the model loads
    _check_text_source(args)
    model, tok = load_model(args.model, args.device, verbose=not args.json)
    policy = _policy_for(args, args.budget, model)
    model.config.check_tokens(args.tokens, "--tokens")
    if args.passages is not None:
        return _stream_passages(args, model, tok, policy)
    ids = _stream_ids(args, tok, model.device)
    result = evaluate_stream(model, ids, policy, args.method, progress=not args.json)
    out = {
        "model": model.config.name, "policy": args.policy, "label": policy.label, "positions": policy.position_rule,
        "budget": budget, "sinks": getattr(policy, "n_sink", 0), "tokens": result.tokens,
        "ppl": result.ppl(), "ppl_after_fill": result.ppl_after_fill, "max_cache_bytes": result.max_cache_bytes,
        "seconds": round(result.seconds, 3), "method": args.method, "device": str(model.device),
    }
    if not args.json:
        after = "n/a (the cache never filled)" if out["ppl_after_fill"] is None else f"{out['ppl_after_fill']:.2f}"
        print(f"{out['model']} {policy.label} [{policy.position_rule} positions] on {out['tokens']} tokens: "
              f"PPL {out['ppl']:.2f}, after the cache fills {after}, max cache "
              f"{out['max_cache_bytes'] / 2**20:.1f} MiB, {out['seconds']:.1f} s")
    return out


def _stream_passages(args: argparse.Namespace, model, tok, policy) -> dict:
    """``stream --passages N``: the same policy over N passages, reported as a spread."""
    from course.passages import sample_passages, spread, stream_passages

    if args.text_file or args.corpus != "austen" or args.book:
        raise ValueError("--passages draws from all six Austen novels: drop --text-file, --book and --corpus")
    if args.passages < 2:
        raise ValueError(f"--passages must be at least 2 (one passage is an anecdote), got {args.passages}")
    passages = sample_passages(tok, args.passages, args.tokens, seed=args.seed)
    start = policy.budget if policy.budget is not None and policy.budget < args.tokens - 1 else 0
    ppl = stream_passages(model, passages, {"policy": policy}, start=start, progress=not args.json)["policy"]
    s = spread(ppl)
    out = {"model": model.config.name, "policy": args.policy, "label": policy.label, "positions": policy.position_rule,
           "tokens": args.tokens, "scored_from": start, "seed": args.seed,
           "ppl": {"mean": s.mean, "median": s.median, "min": s.low, "max": s.high,
                   "ci95_median": list(s.ci) if s.ci else None},
           "passages": [{"book": p.book, "offset": p.offset, "ppl": v} for p, v in zip(passages, ppl)]}
    if not args.json:
        for p, v in zip(passages, ppl):
            print(f"  {p.label:48s} PPL {v:8.2f}")
        print(f"{model.config.name} {policy.label}, {args.tokens} tokens, predictions from {start} on: PPL {s}")
    return out


# ----------------------------------------------------------------------------- needle
def _needle_args(p: argparse.ArgumentParser) -> None:
    from course.policies import policy_names

    _model_args(p)
    _policy_args(p, policy_names(), "snapkv", [128])
    p.add_argument("--depth", type=unit_float, default=0.3, help="where the needle sits, 0 (start) .. 1 (end)")
    p.add_argument("--context", type=positive_int, default=500, help="filler tokens around the needle")
    p.add_argument("--trials", type=positive_int, default=8)
    p.add_argument("--seed", type=seed_int, default=0)
    p.add_argument("--json", action="store_true")


def _needle(args: argparse.Namespace) -> dict | list:
    from course.evaluate import budget_sweep, make_needle_trials
    from course.models import load_model

    if not 0.0 <= args.depth <= 1.0:
        raise ValueError(f"--depth must be between 0 and 1, got {args.depth}")
    for b in args.budget:  # bad values: refused before the model loads
        _policy_for(args, b)
    model, tok = load_model(args.model, args.device, verbose=not args.json)
    trials = make_needle_trials(tok, args.trials, args.context, args.depth, args.seed, model=model)
    rows = budget_sweep(model, trials, args.policy, args.budget, args.sinks, progress=not args.json,
                        positions=args.positions)
    for r in rows:
        r.update(model=model.config.name, depth=args.depth, trials=args.trials,
                 prompt_tokens=int(trials[0].prompt.shape[1]))
        if not args.json:
            print(f"{r['model']} {args.policy} budget {r['budget']} (prompt ~{r['prompt_tokens']} tokens, needle at "
                  f"depth {args.depth}): accuracy {r['accuracy']:.2f}, mean answer log-prob "
                  f"{r['mean_answer_logprob']:.2f}, needle tokens kept {r['needle_kept']:.2f}")
    return rows[0] if len(rows) == 1 else rows


# ----------------------------------------------------------------------------- generate and chat
def _sampling_args(p: argparse.ArgumentParser, max_new_tokens: int) -> None:
    p.add_argument("--max-new-tokens", type=positive_int, default=max_new_tokens)
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy; > 0: sampling")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling cut-off in (0, 1] (default 1)")
    p.add_argument("--seed", type=seed_int, default=0, help="seed of the sampler (default 0)")


def _sampler_check(args: argparse.Namespace) -> None:
    from course.generate import Sampler

    Sampler(args.temperature, args.top_p, args.seed)  # bad values: refused before the model loads


def _generate_args(p: argparse.ArgumentParser) -> None:
    from course.policies import policy_names

    _model_args(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the prompt text")
    src.add_argument("--prompt-file", help="a UTF-8 text file holding the prompt")
    _policy_args(p, policy_names(), "streaming", 256)
    _sampling_args(p, 128)
    p.add_argument("--ignore-eos", action="store_true", help="generate all --max-new-tokens (for measurements)")
    p.add_argument("--json", action="store_true")


def _generate(args: argparse.Namespace) -> dict:
    import time
    from pathlib import Path

    from course.generate import generate
    from course.models import load_model

    _policy_for(args, args.budget)
    _sampler_check(args)
    prompt = args.prompt if args.prompt is not None else Path(args.prompt_file).read_text(encoding="utf-8")
    if not prompt.strip():
        raise ValueError("the prompt is empty")
    model, tok = load_model(args.model, args.device, verbose=not args.json)
    policy = _policy_for(args, args.budget, model)
    start = time.perf_counter()
    steps = []
    for step in generate(model, tok, prompt, policy, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                         top_p=args.top_p, seed=args.seed, ignore_eos=args.ignore_eos):
        steps.append(step)
        if not args.json:
            print(step.text, end="", flush=True)
    seconds = time.perf_counter() - start
    out = {"model": model.config.name, "policy": policy.label, "text": "".join(s.text for s in steps),
           "new_tokens": len(steps), "max_cache_bytes": max((s.cache_bytes for s in steps), default=0),
           "max_cache_slots": max((s.cache_slots for s in steps), default=0), "seconds": round(seconds, 3),
           "seed": args.seed, "temperature": args.temperature, "top_p": args.top_p}
    if not args.json:
        print(f"\n[{out['new_tokens']} tokens in {seconds:.1f} s through {policy.label}; cache at most "
              f"{out['max_cache_slots']} slots, {out['max_cache_bytes'] / 2**20:.2f} MiB]")
    return out


def _chat_args(p: argparse.ArgumentParser) -> None:
    from course.policies import policy_names

    _model_args(p)
    _policy_args(p, policy_names(), "streaming", 256)
    _sampling_args(p, 96)
    p.add_argument("--system", default=None, help="a system message (default: the chat template's own)")
    p.add_argument("--script", help="a text file of user turns, one per line, fed without asking")
    p.add_argument("--json", action="store_true", help="with --script: print the turns as JSON at the end")


def _chat(args: argparse.Namespace) -> dict | None:
    import sys
    import time
    from pathlib import Path

    from course.generate import Chat
    from course.models import load_model

    _policy_for(args, args.budget)
    _sampler_check(args)
    if args.json and not args.script:
        raise ValueError("--json needs --script (an interactive chat prints as it goes)")
    script = None
    if args.script:
        script = [line.strip() for line in Path(args.script).read_text(encoding="utf-8").splitlines() if line.strip()]
        if not script:
            raise ValueError(f"--script {args.script} holds no turns (one user message per non-empty line)")
    model, tok = load_model(args.model, args.device, verbose=not args.json)
    policy = _policy_for(args, args.budget, model)
    chat = Chat(model, tok, policy, system=args.system, max_new_tokens=args.max_new_tokens,
                temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    say = (lambda *a, **k: None) if args.json else print
    say(f"{model.config.name} through {policy.label}. " + ("" if script else "Empty line or Ctrl-D to quit."))
    start = time.perf_counter()
    turns = iter(script) if script is not None else iter(lambda: _ask(sys.stdin), "")
    for text in turns:
        say(f"> {text}" if script is not None else "", end="\n" if script is not None else "")
        for step in chat.say(text):
            say(step.text, end="", flush=True)
        t = chat.turns[-1]
        say(f"\n[cache: {t.cache_slots} slots, {t.cache_bytes / 2**20:.2f} MiB; {t.new_tokens} tokens in "
            f"{t.seconds:.1f} s]")
    out = {"model": model.config.name, "policy": policy.label,
           "turns": [vars(t) for t in chat.turns], "answers": [t.assistant for t in chat.turns],
           "tokens": chat.seen, "max_cache_bytes": max((t.cache_bytes for t in chat.turns), default=0),
           "seconds": round(time.perf_counter() - start, 3)}
    return out if args.json else None


def _ask(stream) -> str:
    """One user line from the terminal ("" at the end of input or on an empty line)."""
    print("you> ", end="", flush=True)
    line = stream.readline()
    return line.strip()


COMMANDS = [
    Command("stream", "perplexity of a long text streamed through a bounded KV cache", _stream_args, _stream),
    Command("needle", "passkey retrieval after compressing the prompt's cache to a budget", _needle_args, _needle),
    Command("generate", "generate text through a cache managed by a policy", _generate_args, _generate),
    Command("chat", "a terminal chat through a bounded cache (or --script FILE of turns)", _chat_args, _chat),
]
