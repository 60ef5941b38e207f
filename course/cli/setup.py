"""Setting up: ``fetch`` (the offline model and corpus) and ``info`` (device, versions, what is cached)."""

from __future__ import annotations

import argparse
import json
import platform

from course.cli.args import Command


# ----------------------------------------------------------------------------- fetch
def _fetch_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("names", nargs="*", default=["smollm2-135m", "austen"],
                   help="assets: smollm2-135m, austen (default: both)")
    p.add_argument("--force", action="store_true", help="derive again even if present and intact")
    p.add_argument("--json", action="store_true")


def _fetch(args: argparse.Namespace) -> dict:
    """Fetch, verify every checksum, repair what is damaged."""
    from course import assets

    folders = assets.fetch(tuple(args.names), progress=not args.json, force=args.force)
    if not args.json:
        for name, folder in folders.items():
            print(f"{name}: ready in {folder}")
    return {name: str(folder) for name, folder in folders.items()}


# ----------------------------------------------------------------------------- info
def _info_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--verify", action="store_true",
                   help="check the SHA-256 of every cached file (exit status 2 if one is damaged)")
    p.add_argument("--json", action="store_true")


def _info(args: argparse.Namespace) -> dict:
    import torch
    import transformers

    from course import __version__, assets
    from course.models import gpt2_available

    problems = assets.verify(full=args.verify)
    status = {name: not found for name, found in problems.items()}
    gpt2_ok, gpt2_why = gpt2_available()
    info = {
        "course": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "cpu_threads": torch.get_num_threads(),
        "cache_dir": str(assets.cache_dir()),
        "models": {"smollm2-135m": status["smollm2-135m"], "gpt2": gpt2_ok,
                   "gpt2-random": status["smollm2-135m"],  # random weights, SmolLM2's tokenizer
                   "gpt2-tiny-random": status["smollm2-135m"]},
        "corpora": {"austen": status["austen"]},
        "problems": {name: [str(p) for p in found] for name, found in problems.items()},
        "verified": "sha256" if args.verify else "size and mtime",
    }
    if not args.json:
        print(f"attention-sinks-course {info['course']}  python {info['python']}  torch {info['torch']}  "
              f"transformers {info['transformers']}")
        print(f"device: {info['device']}"
              + (f" ({info['gpu']})" if info["gpu"] else f" ({info['cpu_threads']} threads)"))
        print(f"cache:  {info['cache_dir']}")
        yes = {True: "available", False: "missing"}

        def state(name: str) -> str:
            if not problems[name]:
                return "available" + (" (every SHA-256 checked)" if args.verify else "")
            return "missing" if not assets.folder_of(name).exists() else f"DAMAGED: {problems[name][0]}"

        print(f"model smollm2-135m: {state('smollm2-135m')}")
        print(f"model gpt2:         {yes[gpt2_ok]} ({gpt2_why})")
        print(f"model gpt2-random:  {state('smollm2-135m')} (GPT-2's shapes, random weights, SmolLM2's tokenizer)")
        print(f"model gpt2-tiny-random: {state('smollm2-135m')} (the same at 4 layers, width 128)")
        print(f"corpus austen:      {state('austen')}")
        if not all(status.values()):
            print("Run `python -m course fetch` to bring the missing assets and repair damaged ones.")
    if args.verify and not all(status.values()):
        if args.json:
            print(json.dumps(info, indent=1, default=str))
        name = next(n for n, ok in status.items() if not ok)
        raise assets.AssetDamaged(f"{name}: {problems[name][0]}; run `python -m course fetch {name}` to repair it")
    return info


COMMANDS = [
    Command("fetch", "download the offline model and corpus into the course cache", _fetch_args, _fetch),
    Command("info", "show device, versions, and which models and corpora are available", _info_args, _info),
]
