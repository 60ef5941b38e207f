"""The published numbers the course quotes, each with the paper, the table or figure and the setting.

Every number a notebook's prose quotes from a paper is in ``RESULTS`` (``tests/experiments/test_papers.py`` fails when a
notebook quotes one that is not), and a notebook that re-runs a result compares its own number with the
value from here (``course.claims.reproduction``), so a quoted number has one source. ``docs/references.md``
lists the works in ``PAPERS`` in full.

    from course.papers import value
    value("streamingllm.table1", "0+1024")     # 5158.07
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["Paper", "PaperResult", "PAPERS", "RESULTS", "value", "result", "quoted_numbers"]


@dataclass(frozen=True)
class Paper:
    """A cited work: ``key`` (used by results), authors, year, title and where to find it."""

    key: str
    authors: str
    year: int | None   # None: undated
    title: str
    arxiv: str | None = None   # e.g. "2309.17453"
    url: str | None = None     # where there is no arXiv ID (a blog post, a repository)
    short: str | None = None   # how the course names it where authors are unknown

    @property
    def cite(self) -> str:
        """A short citation: authors, year and arXiv ID (or address)."""
        where = f"arXiv {self.arxiv}" if self.arxiv else (self.url or "")
        if self.short:
            return self.short
        first = self.authors.split(",")[0].split(" and ")[0].split()[-1]
        many = "," in self.authors or " and " in self.authors
        year = self.year or "n.d."
        return f"{first}{' et al.' if many else ''} ({year}{', ' + where if where else ''})"


@dataclass(frozen=True)
class PaperResult:
    """Numbers from one table or figure of a paper.

    ``values`` maps a label (a cache configuration, a method) to the published number; ``setting`` says what
    was measured on what (model, data, cache), and its numbers count as quoted too (``quoted_numbers``)."""

    key: str
    paper: str
    where: str                 # "Table 2", "Figure 1", "§4.5", "abstract"
    setting: str
    values: dict[str, float] = field(default_factory=dict)

    @property
    def source(self) -> str:
        """``Xiao et al. (2023, arXiv 2309.17453), Table 2``."""
        return f"{PAPERS[self.paper].cite}, {self.where}"


PAPERS: dict[str, Paper] = {p.key: p for p in [
    Paper("streamingllm", "Guangxuan Xiao, Yuandong Tian, Beidi Chen, Song Han and Mike Lewis", 2023,
          "Efficient Streaming Language Models with Attention Sinks (ICLR 2024)", arxiv="2309.17453"),
    Paper("h2o", "Zhenyu Zhang, Ying Sheng, Tianyi Zhou, Tianlong Chen, Lianmin Zheng, Ruisi Cai, Zhao Song, "
          "Yuandong Tian, Christopher Ré, Clark Barrett, Zhangyang Wang and Beidi Chen", 2023,
          "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large Language Models (NeurIPS 2023)",
          arxiv="2306.14048"),
    Paper("snapkv", "Yuhong Li, Yingbing Huang, Bowen Yang, Bharat Venkitesh, Acyr Locatelli, Hanchen Ye, "
          "Tianle Cai, Patrick Lewis and Deming Chen", 2024,
          "SnapKV: LLM Knows What You are Looking for Before Generation", arxiv="2404.14469"),
    Paper("massive", "Mingjie Sun, Xinlei Chen, J. Zico Kolter and Zhuang Liu", 2024,
          "Massive Activations in Large Language Models (COLM 2024)", arxiv="2402.17762"),
    Paper("active-dormant", "Tianyu Guo, Druv Pai, Yu Bai, Jiantao Jiao, Michael I. Jordan and Song Mei", 2024,
          "Active-Dormant Attention Heads: Mechanistically Demystifying Extreme-Token Phenomena in LLMs",
          arxiv="2410.13835"),
    Paper("miller", "Evan Miller", 2023, "Attention Is Off By One (blog post)",
          url="https://www.evanmiller.org/attention-is-off-by-one.html"),
    Paper("deepseek-v2", "DeepSeek-AI", 2024,
          "DeepSeek-V2: A Strong, Economical, and Efficient Mixture-of-Experts Language Model", arxiv="2405.04434"),
    Paper("kvpress", "NVIDIA", 2024, "kvpress: LLM KV cache compression made easy (software)",
          url="https://github.com/NVIDIA/kvpress"),
    Paper("gpt2-replication", "an unsigned blog post", None,
          "Efficient Streaming Language Models with Attention Sinks (a replication of the sliding-window collapse "
          "with GPT-2; no address known to the course)", short="the public GPT-2 replication"),
    Paper("gpt-oss", "OpenAI", 2025, "gpt-oss-120b & gpt-oss-20b Model Card", arxiv="2508.10925"),
    Paper("kivi", "Zirui Liu, Jiayi Yuan, Hongye Jin, Shaochen Zhong, Zhaozhuo Xu, Vladimir Braverman, Beidi Chen "
          "and Xia Hu", 2024, "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache (ICML 2024)",
          arxiv="2402.02750"),
    Paper("intactkv", "Ruikang Liu, Haoli Bai, Haokun Lin, Yuening Li, Han Gao, Zhengzhuo Xu, Lu Hou, Jun Yao and "
          "Chun Yuan", 2024, "IntactKV: Improving Large Language Model Quantization by Keeping Pivot Tokens Intact",
          arxiv="2403.01241"),
    Paper("kvquant", "Coleman Hooper, Sehoon Kim, Hiva Mohammadzadeh, Michael W. Mahoney, Yakun Sophia Shao, "
          "Kurt Keutzer and Amir Gholami", 2024,
          "KVQuant: Towards 10 Million Context Length LLM Inference with KV Cache Quantization", arxiv="2401.18079"),
    Paper("gated-attention", "Zihan Qiu, Zekun Wang, Bo Zheng, Zeyu Huang, Kaiyue Wen, Songlin Yang, Rui Men, Le Yu, "
          "Fei Huang, Suozhi Huang, Dayiheng Liu, Jingren Zhou and Junyang Lin", 2025,
          "Gated Attention for Large Language Models: Non-linearity, Sparsity, and Attention-Sink-Free",
          arxiv="2505.06708"),
    Paper("retrieval-heads", "Wenhao Wu, Yizhong Wang, Guangxuan Xiao, Hao Peng and Yao Fu", 2024,
          "Retrieval Head Mechanistically Explains Long-Context Factuality", arxiv="2404.15574"),
    Paper("duoattention", "Guangxuan Xiao, Jiaming Tang, Jingwei Zuo, Junxian Guo, Shang Yang, Haotian Tang, Yao Fu "
          "and Song Han", 2024,
          "DuoAttention: Efficient Long-Context LLM Inference with Retrieval and Streaming Heads", arxiv="2410.10819"),
    Paper("adakv", "Yuan Feng, Junlin Lv, Yukun Cao, Xike Xie and S. Kevin Zhou", 2024,
          "Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget Allocation for Efficient LLM Inference "
          "(NeurIPS 2025)", arxiv="2407.11550"),
    Paper("pyramidkv", "Zefan Cai, Yichi Zhang, Bofei Gao, Yuliang Liu, Yucheng Li, Tianyu Liu, Keming Lu, "
          "Wayne Xiong, Yue Dong, Junjie Hu and Wen Xiao", 2024,
          "PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information Funneling (COLM 2025)",
          arxiv="2406.02069"),
]}

RESULTS: dict[str, PaperResult] = {r.key: r for r in [
    PaperResult("streamingllm.table1", "streamingllm", "Table 1",
                "Llama-2-13B, first book of the PG-19 test set (65K tokens), cache 0+1024 / 4+1020",
                {"0+1024": 5158.07, "4+1020": 5.40, '4"\\n"+1020': 5.60}),
    PaperResult("streamingllm.figure1", "streamingllm", "Figure 1",
                "Llama-2-13B, first PG-19 book, cache 1024 (dense: past the trained length of 4096)",
                {"dense": 5641, "window": 5158, "recomputation": 5.43, "StreamingLLM": 5.40}),
    PaperResult("streamingllm.table2.llama2", "streamingllm", "Table 2",
                "Llama-2-7B, 400K tokens of concatenated PG-19, cache 0+4096 / 1+4095 / 2+4094 / 4+4092 / 8+4088",
                {"0": 3359.95, "1": 11.88, "2": 10.51, "4": 9.59, "8": 9.54}),
    PaperResult("streamingllm.table2.falcon", "streamingllm", "Table 2",
                "Falcon-7B, 400K tokens of concatenated PG-19, cache 0+2048 / 1+2047 / 2+2046 / 4+2044 / 8+2040",
                {"0": 17.90, "1": 12.12, "2": 12.12, "4": 12.12, "8": 12.12}),
    PaperResult("streamingllm.table2.mpt", "streamingllm", "Table 2",
                "MPT-7B, 400K tokens of concatenated PG-19, cache 0+2048 ... 8+2040",
                {"0": 460.29, "1": 14.99, "2": 15.00, "4": 14.99, "8": 14.98}),
    PaperResult("streamingllm.table2.pythia", "streamingllm", "Table 2",
                "Pythia-12B, 400K tokens of concatenated PG-19, cache 0+2048 ... 8+2040",
                {"0": 21.62, "1": 11.95, "2": 12.09, "4": 12.09, "8": 12.02}),
    PaperResult("streamingllm.table3", "streamingllm", "Table 3",
                "three 160M-parameter models pretrained from scratch (§3.3, Pythia-160M recipe, the Pile), "
                "first PG-19 sample, cache 0+1024 / 1+1023 / 2+1022 / 4+1020",
                {"vanilla 0": 27.87, "vanilla 1": 18.49, "vanilla 2": 18.05, "vanilla 4": 18.05,
                 "zero sink 0": 29214, "zero sink 1": 19.90, "zero sink 2": 18.27, "zero sink 4": 18.01,
                 "sink token 0": 1235, "sink token 1": 18.01, "sink token 2": 18.01, "sink token 4": 18.02}),
    PaperResult("streamingllm.figure5", "streamingllm", "Figure 5",
                "Llama-2-[7,13,70]B, Falcon-[7,40]B, Pythia-[2.8,6.9,12]B and MPT-[7,30]B streaming the "
                "concatenated PG-19 test set (100 books): perplexity stays stable",
                {"tokens streamed, millions": 4}),
    PaperResult("streamingllm.speedup", "streamingllm", "§4.5, Figure 10",
                "Llama-2-7B and -13B on one A6000: per-token decoding latency against sliding window with "
                "recomputation, up to a 4096-token cache",
                {"speed-up": 22.2}),
    PaperResult("streamingllm.figure12", "streamingllm", "Appendix F, Figure 12",
                "Llama-2-7B, 256 sequences of 4096 tokens: the 4096th token's attention on the first token, "
                "per layer",
                {"share of attention on the first token, most layers": 0.5, "bottom layers without a sink": 2}),
    PaperResult("streamingllm.streameval", "streamingllm", "§4.3, Figure 8",
                "StreamEval: a query every 10 lines, each answer 20 lines (about 460 tokens) back",
                {"lines between queries": 10, "lines back": 20, "tokens back": 460}),
    PaperResult("streamingllm.table7", "streamingllm", "Appendix C, Table 7",
                "StreamEval with Llama-2-7B-32K-Instruct, 23 tokens a line, cache 4+2044: accuracy when the "
                "answer lies 20 lines back (inside the cache) and 100 lines back (beyond it)",
                {"20 lines, 4+2044": 85.80, "100 lines, 4+2044": 0.00}),
    PaperResult("h2o.table2", "h2o", "Table 2",
                "OPT-30B, COPA, 20 % KV-cache budget (heavy hitters + recent) against the full cache",
                {"H2O": 84.0, "full cache": 85.0}),
    PaperResult("snapkv.abstract", "snapkv", "abstract",
                "16K-token inputs, against the full-cache baseline",
                {"decoding speed-up": 3.6, "memory efficiency": 8.2}),
    PaperResult("snapkv.speed-memory", "snapkv", "§5.1.2",
                "one A100-80GB, batch 2: generation speed with every prompt compressed to 2048 slots, and the "
                "longest input that fits before running out of memory, with SnapKV (131K tokens) and with the full "
                "cache (16K tokens)",
                {"slots kept": 2048, "batch": 2, "longest input with SnapKV, K tokens": 131,
                 "longest input with the full cache, K tokens": 16}),
    PaperResult("massive.abstract", "massive", "abstract",
                "very few activations are far larger than the others",
                {"times larger than the others": 100000}),
    PaperResult("massive.figure1", "massive", "Figure 1",
                "LLaMA2-7B: massive activations in two fixed feature dimensions (1415, 2533), at the starting "
                "token and at the first period or newline token",
                {}),
    PaperResult("active-dormant.abstract", "active-dormant", "abstract",
                "attention sinks, value-state drains (small values of the sink token) and residual-state peaks, "
                "in toy transformers and in Llama and OLMo",
                {}),
    PaperResult("gpt2-replication", "gpt2-replication", "its only figure",
                "GPT-2 (124M), sliding-window cache of 256 inside a 1024-token context",
                {"perplexity before": 10, "perplexity after token 257": 3000}),
    PaperResult("deepseek-v2.table1", "deepseek-v2", "Table 1, §2.1",
                "DeepSeek-V2: MLA caches (d_c + d_h^R) numbers per token and layer, d_c = 512 (kv_lora_rank), "
                "d_h^R = 64 (qk_rope_head_dim), 60 layers",
                {"d_c": 512, "d_h^R": 64, "numbers per token and layer": 576}),
    PaperResult("gated-attention.table4", "gated-attention", "Table 4 (F-Attn) and Figure 2",
                "models pretrained from scratch with and without a gate after SDPA (Table 4's rows are Table 1's "
                "15B mixture-of-experts models, 400B tokens): attention on the first token, averaged over layers "
                "and heads, on the test-perplexity data",
                {"baseline": 0.467, "elementwise gate": 0.048, "headwise gate": 0.073,
                 "mean gate score, elementwise": 0.116}),
    PaperResult("retrieval-heads.abstract", "retrieval-heads", "abstract",
                "4 model families, 6 scales, 3 kinds of finetuning: retrieval heads are universal, sparse, intrinsic, "
                "dynamically activated and causal (pruning them breaks retrieval, pruning random non-retrieval heads "
                "does not)",
                {"share of heads that are retrieval heads, % (less than)": 5,
                 "retrieval heads always active, Llama-2 7B": 12}),
    PaperResult("retrieval-heads.detection", "retrieval-heads", "§2",
                "retrieval score of a head = |g_h ∩ k| / |k|, the share of the needle's tokens k it copy-pastes (at "
                "a greedy decoding step its most-attended input token is in the needle and equals the token "
                "generated), averaged over the tests: three needle sets, each at 20 lengths from 1K to 50K and 10 "
                "depths; a head scoring at least the threshold is a retrieval head",
                {"threshold": 0.1, "needle sets": 3, "tests per model, about": 600}),
    PaperResult("retrieval-heads.figure3", "retrieval-heads", "§3.1, Figure 3",
                "share of all heads by retrieval score, the range over the models of Figure 3 (Llama-2, Yi, "
                "Qwen1.5, Mistral and Mixtral variants)",
                {"score 0, % low": 45, "score 0, % high": 73, "score 0 to 0.1, % low": 25,
                 "score 0 to 0.1, % high": 52, "score above 0.1, % low": 3, "score above 0.1, % high": 6,
                 "score above 0.5, % (less than)": 5}),
    PaperResult("retrieval-heads.figure7", "retrieval-heads", "§4.1, Figure 7",
                "Needle-in-a-Haystack on needles other than the detection sets, masking the top K retrieval heads "
                "against K random heads: masking retrieval heads severely damages the needle score, random heads much "
                "less",
                {"K": 50, "K as % of all heads, about": 5, "needle score at K = 50, every model, below": 50}),
    PaperResult("duoattention.abstract", "duoattention", "abstract; §3.4, Figures 10 and 11",
                "up to, against full attention on one A100: MHA (Llama-2-7B) and GQA (Llama-3-8B) models; with "
                "8-bit weights and a 4-bit KV cache, Llama-3-8B decodes 3.3 million tokens of context on one A100",
                {"memory reduction, MHA": 2.55, "memory reduction, GQA": 1.67, "decoding speed-up, MHA": 2.18,
                 "decoding speed-up, GQA": 1.50, "pre-filling speed-up, MHA": 1.73, "pre-filling speed-up, GQA": 1.63}),
    PaperResult("duoattention.setup", "duoattention", "§3.1, §3.2",
                "retrieval heads keep the full cache, streaming heads sinks + recent tokens; the share of retrieval "
                "(KV) heads kept: Llama-2-7B-32K-Instruct (MHA), Llama-3-8B-Instruct-Gradient-1048k (GQA); "
                "streaming heads while identifying the heads and when deployed on NIAH and LongBench",
                {"retrieval heads, MHA, %": 25, "retrieval heads, GQA, %": 50, "sinks, identifying": 128,
                 "recent, identifying": 256, "sinks, deployed": 64, "recent, deployed": 256}),
    PaperResult("duoattention.gates", "duoattention", "§2.2, §3.1",
                "one gate α in [0, 1] per KV head, starting at 1, mixes the head's full and streaming attention "
                "(α·full + (1 − α)·streaming); the model is frozen; loss: the squared L2 difference of the last "
                "hidden states of full and mixed attention on the passkey tokens, plus λ times the L1 norm of the "
                "gates; data: 32-word passkeys (§2.2: 32 tokens) inserted in BookSum text, recalled at the end; AdamW",
                {"λ": 0.05, "passkeys a sample": 10, "steps": 2000, "learning rate": 0.02}),
    PaperResult("duoattention.figure13", "duoattention", "§3.5, Figure 13 (3)",
                "Mistral-7B-Instruct-v0.2, passkey retrieval (an 8-word passkey in 30K words, 100 depths): the "
                "deployed streaming heads' sinks and recent tokens, beyond which accuracy gains are marginal",
                {"sinks": 16, "recent": 64}),
    PaperResult("adakv.abstract", "adakv", "abstract",
                "an upper bound on the L1 loss between the attention outputs before and after eviction; one "
                "budget allocated adaptively across heads instead of uniformly, plugged into SnapKV and Pyramid "
                "(Ada-SnapKV, Ada-Pyramid); quality gains over uniform allocation, no headline number",
                {"Ruler datasets": 13, "LongBench datasets": 16}),
    PaperResult("pyramidkv.abstract", "pyramidkv", "abstract",
                "LongBench, cache per layer shrinking with depth (more in lower layers); Needle-in-a-Haystack with "
                "LLaMA-3-70B",
                {"% of the cache kept, matching the full cache": 12, "% of the cache kept, low budget": 0.7,
                 "TREC accuracy gain at that budget, up to, absolute": 20.5, "entries kept, needle test": 128,
                 "needle accuracy, %": 100.0}),
]}


def result(key: str) -> PaperResult:
    """The published result ``key``; an unknown key raises ``KeyError`` listing the known ones."""
    if key not in RESULTS:
        raise KeyError(f"no paper result {key!r}; known: {', '.join(sorted(RESULTS))}")
    return RESULTS[key]


def value(key: str, label: str) -> float:
    """One published number: ``value("streamingllm.table2.llama2", "4")`` -> 9.59."""
    r = result(key)
    if label not in r.values:
        raise KeyError(f"{key} ({r.source}) has no value {label!r}; it has {', '.join(r.values)}")
    return r.values[label]


NUMBER = re.compile(r"(?<![\w.])(?:\d{1,3}(?:[ ,]\d{3})+(?![\d.])|\d+(?:\.\d+)?)")


def numbers_in(text: str) -> set[float]:
    """Every number written in ``text`` (``5 641`` and ``5,641`` read as 5641; ``400K`` as 400)."""
    return {float(re.sub(r"[ ,]", "", m.group(0))) for m in NUMBER.finditer(text)}


def quoted_numbers() -> set[float]:
    """Every number the table holds: published values and the numbers of their settings."""
    out: set[float] = set()
    for r in RESULTS.values():
        out |= {float(v) for v in r.values.values()} | numbers_in(r.setting) | numbers_in(" ".join(r.values))
    return out
