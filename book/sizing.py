"""Plan a training run: memory and communication per device for a layout, and a step's bound.

A decoder-only transformer (``Transformer``, with presets of published models) is laid out over
``dp x fsdp x tp x pp`` devices: data parallelism over ``dp`` (parameters replicated), FSDP over
``fsdp`` (batch and parameters split), Megatron tensor parallelism over ``tp`` (heads, MLP
hidden units and vocabulary split) and pipeline stages over ``pp`` (layers split).
``plan(model, ...)`` counts, per device, the bytes of parameters, gradients, optimizer state and
activations, and the bytes each device sends per step for each kind of parallelism;
``plan(...).seconds(HARDWARE[name])`` turns them into a lower bound on the step time.

Chapter 18 and tests/test_sizing.py check the counts against programs XLA compiled at small
scale; the conventions behind them are keyword arguments of ``plan`` with the defaults stated
there. The collective formulas and the alpha-beta time are ``book.cost``'s, the ones chapter
12 uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import ml_dtypes
import numpy as np

from book import cost, validate
from book.errors import ReaderError


class SizingError(ReaderError, ValueError):
    """A model, layout or convention the calculator cannot plan, in one sentence."""


DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float8": 1}
OPTIMIZER_MOMENTS = {"adamw": 2, "sgd": 0}
REMAT = ("full", "minimal", "none")
# Pipeline schedules: the same steps and bubble, different microbatches in flight.
SCHEDULES = ("gpipe", "1f1b", "interleaved")
GRADIENT_REDUCE = ("reduce-scatter", "all-reduce")
KINDS = ("dp", "fsdp", "cp", "tp", "pp", "ep")
# Axes from the innermost (neighbouring devices) outwards: the order a fast domain fills.
# Context parallelism's all-to-alls run every layer, as TP's all-reduces do: next to TP; expert
# parallelism's too, next to CP.
INNER_TO_OUTER = ("tp", "cp", "ep", "fsdp", "pp", "dp")


@dataclass(frozen=True)
class Transformer:
    """The shape of a decoder-only transformer with grouped-query attention.

    Untied embedding and unembedding, two RMS norms per layer and a final one, no biases (as
    Llama and chapter 13's model). ``gated`` MLPs (SwiGLU, as Llama) have three matrices of
    ``d_model x d_ff``; chapter 13's GELU MLP has two. ``head_dim`` defaults to
    ``d_model // heads``.

    With ``experts`` (0: dense), each layer's MLP is a mixture of experts (chapter 21's): a
    router of ``d_model x experts`` and ``experts`` MLPs of ``d_ff`` hidden units each (gated
    or not, as ``gated``), of which each token runs ``top_k``.
    """

    layers: int
    d_model: int
    d_ff: int
    heads: int
    kv_heads: int
    vocab: int
    head_dim: int | None = None
    gated: bool = True
    experts: int = 0
    top_k: int = 1

    def __post_init__(self):
        # Kept as Python numbers: a NumPy or JAX integer would overflow in the products below.
        def keep(name, value):
            object.__setattr__(self, name, value)

        for name in ("layers", "d_model", "d_ff", "heads", "kv_heads", "vocab"):
            keep(
                name, validate.whole(getattr(self, name), f"The model's {name}", error=SizingError)
            )
        keep("gated", validate.flag(self.gated, "gated", error=SizingError))
        keep(
            "experts",
            validate.whole(self.experts, "The model's experts", low=0, error=SizingError),
        )
        keep("top_k", validate.whole(self.top_k, "The model's top_k", error=SizingError))
        if not self.experts and self.top_k != 1:
            raise SizingError(
                f"top_k={self.top_k} needs experts; give the model experts, or leave top_k at 1."
            )
        if self.experts and self.top_k > self.experts:
            raise SizingError(
                f"top_k={self.top_k} is more than the model's {self.experts} experts; choose a "
                f"top_k of at most {self.experts}."
            )
        if self.head_dim is None:
            if self.d_model % self.heads:
                raise SizingError(
                    f"d_model {self.d_model} is not a multiple of heads {self.heads}; give "
                    "head_dim explicitly."
                )
            keep("head_dim", self.d_model // self.heads)
        keep("head_dim", validate.whole(self.head_dim, "The model's head_dim", error=SizingError))
        if self.heads % self.kv_heads:
            raise SizingError(
                f"{self.heads} query heads do not split into groups for {self.kv_heads} K/V "
                "heads; choose kv_heads that divides heads."
            )


# Published shapes (the models' config.json on Hugging Face).
PRESETS = {
    "Llama 3 8B": Transformer(32, 4096, 14336, 32, 8, 128256),
    "Llama 3 70B": Transformer(80, 8192, 28672, 64, 8, 128256),
}
PRESET_SOURCES = {
    "Llama 3 8B": "https://huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json",
    "Llama 3 70B": "https://huggingface.co/meta-llama/Meta-Llama-3-70B/blob/main/config.json",
}


def _arrays(m: Transformer) -> dict[str, tuple[int, dict[str, int]]]:
    """Every parameter array of one layer or outside them: (size, {kind: dimension it splits}).

    A kind maps to the length of the dimension it splits, so a device holds
    ``size / length * ceil(length / degree)`` elements: XLA pads a dimension that does not
    divide. TP splits K/V heads (Q, K and V by K/V head, as chapter 13 lays out ``wqkv``), the
    output projection's heads, the MLP's hidden units and the vocabulary; FSDP splits
    ``d_model`` wherever it occurs; norms are split by FSDP only. With experts, the router is
    split by FSDP only, and EP splits the experts' leading dimension.
    """
    d, h, k, dh, f = m.d_model, m.heads, m.kv_heads, m.head_dim, m.d_ff
    mlp = (3 if m.gated else 2) * d * f
    layer = {
        "norms": (2 * d, {"fsdp": d}),
        "wqkv": (d * (h + 2 * k) * dh, {"fsdp": d, "tp": k}),
        "wo": (h * dh * d, {"fsdp": d, "tp": k}),
    }
    if m.experts:
        layer["router"] = (d * m.experts, {"fsdp": d})
        layer["experts"] = (m.experts * mlp, {"ep": m.experts, "fsdp": d, "tp": f})
    else:
        layer["mlp"] = (mlp, {"fsdp": d, "tp": f})
    outside = {
        "embed": (m.vocab * d, {"fsdp": d, "tp": m.vocab}),
        "final_norm": (d, {"fsdp": d}),
        "unembed": (d * m.vocab, {"fsdp": d, "tp": m.vocab}),
    }
    return {**{f"layer.{n}": a for n, a in layer.items()}, **outside}


@validate.impostors_refused
def param_count(model: Transformer) -> int:
    """Parameters of ``model``: every layer's, the embedding, the final norm and the unembedding.

    Llama 3 8B gives 8,030,261,248 and 70B 70,553,706,496, the published 8.03B and 70.6B.
    """
    _check_model(model)
    arrays = _arrays(model)
    per_layer = sum(size for name, (size, _) in arrays.items() if name.startswith("layer."))
    rest = sum(size for name, (size, _) in arrays.items() if not name.startswith("layer."))
    return model.layers * per_layer + rest


def _check_model(model) -> Transformer:
    if not isinstance(model, Transformer):
        raise SizingError(
            "The model must be a book.sizing.Transformer, such as PRESETS['Llama 3 8B'], not "
            f"{validate.describe(model)}."
        )
    return model


def _held(size: int, splits: dict[str, int], degree: dict[str, int]) -> int:
    """Elements of one array on one device, each split dimension padded to its degree."""
    held = size
    for kind, length in splits.items():
        held = held // length * math.ceil(length / degree.get(kind, 1))
    return held


@dataclass(frozen=True)
class Collective:
    """Collectives of one kind that one device takes part in during a step.

    ``sent`` is the bytes one of them sends from each device (``book.cost``'s ring formulas),
    ``count`` how many run per step, over a group of ``n`` devices; ``in_layers`` whether they
    belong to the layers (the compiled program's loops) or to the ends of the model.
    """

    kind: str
    op: str
    what: str
    sent: float
    count: int
    n: int
    in_layers: bool


def _number(value, name, example, *, zero=False):
    """A rate or size from 1 to 1e30, or a latency (``zero``) from 0 to an hour, or
    SizingError in one sentence.

    A rate below 1 (a chip of 1e-300 FLOP/s) would make every time infinite, and one near
    the largest float makes a layout's total overflow, so that compute takes 0 seconds; a
    hop longer than an hour is no link.
    """
    low = 0 if zero else 1
    return validate.number(
        value,
        name,
        low=low,
        high=validate.MAX_SECONDS if zero else 1e30,
        wanted=f"a number of at least {low} such as {example}",
        error=SizingError,
    )


@dataclass(frozen=True)
class Link:
    """One kind of link: bytes per second a device sends along one mesh axis, latency per hop."""

    name: str
    bandwidth: float
    hop_latency: float
    source: str

    def __post_init__(self):
        validate.text(self.name, "a link's name", example="'ICI'", error=SizingError)
        bandwidth = _number(self.bandwidth, "A link's bandwidth (bytes per second)", "450e9")
        object.__setattr__(self, "bandwidth", bandwidth)
        latency = _number(self.hop_latency, "A link's hop latency (seconds)", "1e-6", zero=True)
        object.__setattr__(self, "hop_latency", latency)
        validate.text(
            self.source, "a link's source", example="'https://…'", limit=1000, error=SizingError
        )


@dataclass(frozen=True)
class Hardware:
    """A chip and its links: ``fast`` within a domain of ``domain`` chips, ``slow`` beyond.

    ``torus_dims``: how many dimensions of its fast links' torus one mesh axis may span (a
    TPU slice's 2 or 3; 1 for a GPU board, whose switch gives every axis the whole NVLink).
    """

    name: str
    peak_flops: float
    hbm_bytes: float
    fast: Link
    slow: Link
    domain: int
    source: str
    hbm_bandwidth: float | None = None  # bytes per second between HBM and the cores
    torus_dims: int = 1

    def __post_init__(self):
        # Kept as Python floats: a NumPy float32 or a JAX scalar would carry into every time.
        def keep(name, value):
            object.__setattr__(self, name, value)

        name = validate.text(self.name, "a chip's name", example="'H100 SXM'", error=SizingError)
        keep("name", name)
        keep("peak_flops", _number(self.peak_flops, "A chip's peak FLOP/s", "989e12"))
        keep("hbm_bytes", _number(self.hbm_bytes, "A chip's HBM (bytes)", "80e9"))
        if self.hbm_bandwidth is not None:
            bandwidth = _number(
                self.hbm_bandwidth, "A chip's HBM bandwidth (bytes per second)", "3.35e12"
            )
            keep("hbm_bandwidth", bandwidth)
        for which in ("fast", "slow"):
            if not isinstance(getattr(self, which), Link):
                raise SizingError(
                    f"A chip's {which} link must be a book.sizing.Link, not "
                    f"{validate.describe(getattr(self, which))}."
                )
        domain = validate.whole(
            self.domain, "A chip's fast domain", high=validate.MAX_DEVICES, error=SizingError
        )
        keep("domain", domain)
        dims = validate.whole(
            self.torus_dims, "A chip's torus dimensions", high=3, error=SizingError
        )
        keep("torus_dims", dims)
        validate.text(
            self.source, "a chip's source", example="'https://…'", limit=1000, error=SizingError
        )


def _tpu(name, page, tflops, hbm, ici_total, ports, domain, dcn_per_pod_bits, hbm_bandwidth, note):
    """A TPU: its ICI shared by its ports, two a torus dimension (one each way), its slice's
    DCN bandwidth shared by its chips."""
    ici = Link(
        "ICI",
        ici_total / ports,  # an axis's ring uses two of the ports, one way each
        1e-6,
        f"{page} (bidirectional ICI per chip over its {ports} ports: "
        f"{ici_total / ports / 1e9:.0f} GB/s an axis; the scaling book's table of ICI "
        "bandwidth per link, https://jax-ml.github.io/scaling-book/tpus/, gives "
        f"{90 if name == 'TPU v5e' else 180} GB/s both ways, about a tenth less); hop "
        "latency assumed: 1 µs, the scaling book's 'typically around 1us' "
        "(https://jax-ml.github.io/scaling-book/sharding/), not a published figure",
    )
    dcn = Link(
        "DCN",
        dcn_per_pod_bits / 8 / domain,
        1e-5,
        f"{page} (data-center network bandwidth, per chip of a {domain}-chip slice); hop "
        "latency assumed (10 µs), not published",
    )
    source = f"{page} ({note}; torus: the page's interconnect topology)"
    hardware = (name, tflops * 1e12, hbm, ici, dcn, domain, source, hbm_bandwidth)
    return Hardware(*hardware, torus_dims=ports // 2)


def _gpu(name, page, hbm, hbm_bandwidth):
    """An NVIDIA GPU, the SXM part, on an 8-GPU HGX board: NVLink within it, InfiniBand beyond."""
    nvlink = Link(
        "NVLink",
        450e9,  # 900 GB/s both directions together; NVSwitch gives an axis all of it
        0.6e-6,
        f"{page} (NVLink 900 GB/s, both directions); hop latency: NCCL's NVLink figure "
        "for its ring LL protocol, the smallest of its ring protocols (Simple: 3.4 µs), in "
        "src/graph/tuning.cc at 5067397 (https://github.com/NVIDIA/nccl); NCCL also adds "
        "6.6 to 14 µs per collective, which this leaves out",
    )
    infiniband = Link(
        "InfiniBand",
        400e9 / 8,  # one 400 Gb/s NDR adapter per GPU, as in NVIDIA's DGX H100 and H200
        2.7e-6,
        "https://docs.nvidia.com/dgx-basepod/reference-architecture-infrastructure-"
        "foundation-enterprise-ai/latest/core-components.html (DGX H100 and H200: eight "
        "400 Gb/s ConnectX-7 for eight GPUs); hop latency: NCCL's network (NET) figure for "
        "its ring LL protocol, the smallest of its ring protocols (Simple: 14 µs), in "
        "src/graph/tuning.cc at 5067397 (https://github.com/NVIDIA/nccl)",
    )
    return Hardware(name, 989e12, hbm, nvlink, infiniband, 8, page, hbm_bandwidth)


# Published figures, not measured here: per chip, dense bfloat16 FLOP/s and HBM bytes; per
# link kind, the bytes per second one chip sends along one mesh axis and a hop's latency.
# HBM as the vendors' pages write it, in GB read as 10**9 bytes (the smaller reading of GB),
# or in GiB where a page says GiB (v5p's);
# HBM bandwidth likewise, GB/s or TB/s read as 10**9 or 10**12 bytes per second.
# "H100" and "H200" are the SXM parts of NVIDIA's HGX boards, whose figures these are.
HARDWARE = {
    "TPU v5e": _tpu(
        "TPU v5e",
        "https://cloud.google.com/tpu/docs/v5e",
        197,
        16e9,
        400e9,
        4,
        256,
        6.4e12,
        819e9,
        "HBM bandwidth 819 GB/s, as the page's table of key chip specifications gives "
        "it; another table of the same page says 800 GiB/s (859e9), and the scaling book "
        "uses 8.1e11 (tpus.md); this uses 819e9",
    ),
    "TPU v5p": _tpu(
        "TPU v5p",
        "https://cloud.google.com/tpu/docs/v5p",
        459,
        95 * 2**30,
        1200e9,
        6,
        6144,
        6144 * 50e9,  # 50 Gb/s per chip
        2765e9,
        "HBM 95 GiB, as the page's table gives it in GiB (the chip has 96 GiB, the page "
        "notes); the scaling book's table gives 96 GB (tpus.md)",
    ),
    "TPU v6e": _tpu(
        "TPU v6e",
        "https://cloud.google.com/tpu/docs/v6e",
        918,
        32e9,
        800e9,
        4,
        256,
        25.6e12,
        1640e9,
        "HBM and its bandwidth as the page's table gives them",
    ),
    "H100": _gpu("H100", "https://www.nvidia.com/en-us/data-center/h100/", 80e9, 3.35e12),
    "H200": _gpu("H200", "https://www.nvidia.com/en-us/data-center/h200/", 141e9, 4.8e12),
}


@dataclass(frozen=True)
class Seconds:
    """A step's time on some hardware, in seconds, at peak FLOP/s and link bandwidth.

    ``compute`` is the step's FLOPs (remat's recomputation and the pipeline's bubble
    included) over the chips' peak; ``comm`` each kind's collectives on its link; ``bound``
    the longer of those, what the step takes at best, every collective hidden behind
    computation; ``serial`` their sum, with none hidden. ``mfu`` is the model's FLOPs over
    what the chips could do in ``bound``: the highest MFU this layout allows.
    """

    compute: float
    comm: dict
    links: dict
    bound: float
    serial: float
    mfu: float


@dataclass(frozen=True)
class Plan:
    """Memory per device (bytes) and communication per device (bytes sent per step)."""

    model: Transformer
    layout: dict
    global_batch: int
    seq: int
    conventions: dict
    memory: dict
    comm: dict
    collectives: tuple = field(repr=False)
    flops: dict = field(repr=False)

    @property
    def devices(self) -> int:
        return math.prod(self.layout.values())

    def links(self, hardware: Hardware) -> dict:
        """Which link each kind's axis runs over: the fast one while the axes inside fit.

        Axes fill the fast domain from the inside out, ``tp`` first, then ``fsdp``, ``pp`` and
        ``dp``: an axis whose devices, with those of the axes inside it, fit in one domain
        stays on the fast link; otherwise its rings cross the slow one.
        """
        return _links(self.layout, INNER_TO_OUTER, _chip(hardware))

    def seconds(self, hardware, torus=None) -> Seconds:
        """Compute, communication and the step's lower bound on ``hardware``.

        Each mesh axis gets one ring; ``torus`` ({kind: dimensions}, such as ``{"fsdp": 2}``)
        lays an axis on the fast links over that many dimensions of a TPU's torus, each with
        a ring of its own, and so multiplies its bandwidth by as many. Each dimension must be
        the axis's whole, with its wraparound links (a group shorter than the torus has none),
        and the axes together span at most the torus's dimensions.
        """
        hardware = _chip(hardware)
        links = self.links(hardware)
        for kind, dims in _torus(torus, hardware, links, self.layout).items():
            links[kind] = replace(links[kind], bandwidth=links[kind].bandwidth * dims)
        comm = _comm_seconds(self.collectives, links, KINDS)
        compute = self.flops["hardware"] / (self.devices * hardware.peak_flops)
        bound = max(compute, *comm.values())
        mfu = self.flops["model"] / (bound * self.devices * hardware.peak_flops)
        kinds = {k: links[k].name for k in KINDS}
        return Seconds(compute, comm, kinds, bound, compute + sum(comm.values()), mfu)

    def seconds_of(self, hardware, collectives) -> float:
        """Seconds that ``collectives``, some of this plan's, take one after another on
        ``hardware``, by the alpha-beta model of ``seconds``: the time a step loses where a
        schedule leaves them nothing to overlap (DP's all-reduce waits for the last
        microbatch's gradients, for one)."""
        hardware = _chip(hardware)
        chosen = validate.plain(collectives)
        chosen = list(chosen) if isinstance(chosen, (list, tuple)) else None
        if chosen is None or not all(
            isinstance(c, Collective) and any(c is mine for mine in self.collectives)
            for c in chosen
        ):
            what = validate.describe(collectives)
            if chosen is not None and all(isinstance(c, Collective) for c in chosen):
                what = "collectives of another plan, equal or not"
            raise SizingError(
                f"Pass a list of this plan's collectives (items of plan.collectives), not {what}."
            )
        return sum(_comm_seconds(chosen, self.links(hardware), KINDS).values())


def _torus(torus, hardware: Hardware, links: dict, layout: dict) -> dict[str, int]:
    """``torus`` checked: kinds of axis on the fast links, each over a number of dimensions."""
    if torus is None:
        return {}
    given, torus = torus, validate.plain_mapping(torus)
    if not isinstance(torus, dict):
        raise SizingError(
            f'torus must be a dict such as {{"fsdp": 2}}, not {validate.describe(given)}.'
        )
    out = {}
    for kind, dims in torus.items():
        kind = validate.choice(kind, list(KINDS), "a kind of axis", error=SizingError)
        top = hardware.torus_dims
        dims = validate.whole(
            dims,
            f"torus[{kind!r}]",
            high=top,
            too_large=f"more dimensions than {hardware.name}'s links give an axis",
            error=SizingError,
        )
        if dims > 1 and links[kind] is not hardware.fast:
            raise SizingError(
                f"{kind}'s axis runs over {links[kind].name}, not a torus; give it 1 dimension."
            )
        if dims > 1 and _factors(layout[kind]) < dims:  # each dimension holds 2 devices or more
            raise SizingError(
                f"{kind}'s {layout[kind]} devices cannot span {dims} dimensions of a torus, each "
                "of 2 devices or more; give it fewer."
            )
        out[kind] = dims
    # Every other axis on the fast links with more than one device takes a dimension too.
    spanned = sum(
        out.get(k, 1) for k in KINDS if layout[k] > 1 and links[k] is hardware.fast
    )  # axes of one device, and those on slower links, take no dimension
    if spanned > hardware.torus_dims:
        raise SizingError(
            f"{hardware.name}'s torus has {hardware.torus_dims} dimensions, and {torus}, with "
            f"the layout's other axes on the torus, asks for {spanned}; give the axes at most "
            "that many together."
        )
    return out


def _factors(n: int) -> int:
    """How many prime factors ``n`` has, counted with repeats: the most torus dimensions of
    2 devices or more its devices can span (12 = 2 x 2 x 3: three)."""
    count, p = 0, 2
    while p * p <= n:
        while n % p == 0:
            n, count = n // p, count + 1
        p += 1
    return count + (n > 1)


def _comm_seconds(collectives, links, kinds) -> dict[str, float]:
    """Seconds of each kind of axis's collectives: the alpha-beta model, ring by ring."""
    comm = dict.fromkeys(kinds, 0.0)
    for c in collectives:
        link = links[c.kind]
        steps = cost.ring_steps(c.op, c.n)
        one = cost.collective_seconds(c.sent, steps, link.bandwidth, link.hop_latency)
        comm[c.kind] += c.count * one
    return comm


def _links(layout: dict, inner_to_outer: tuple, hardware: Hardware) -> dict:
    """Each kind's link: the fast one while its devices and those of the axes inside it fit in
    one fast domain, the slow one beyond.

    A slow link's bandwidth is a device's share of its domain's: where the axes inside fill
    the domain, each device's ring crosses on its own share (a GPU's network card); where
    they leave room, the axis holds ``domain / inside`` devices of each domain, and its
    collectives cross on all of their shares at once (NCCL's rings, one per card: the
    domain's egress over the groups inside), but never faster than the fast links its rings
    also run through. Then one hop of the ring in ``domain / inside`` leaves the domain: a
    hop's latency is the average of that one slow hop and the fast rest.
    """
    inside, out = 1, {}
    for kind in inner_to_outer:
        shares = max(1, hardware.domain // inside)  # this axis's devices in one domain
        inside *= layout[kind]
        if inside <= hardware.domain:
            out[kind] = hardware.fast
        elif shares == 1:
            out[kind] = hardware.slow
        else:
            fast, slow = hardware.fast.hop_latency, hardware.slow.hop_latency
            out[kind] = replace(
                hardware.slow,
                bandwidth=min(hardware.slow.bandwidth * shares, hardware.fast.bandwidth),
                hop_latency=(slow + (shares - 1) * fast) / shares,
            )
    return out


def _whole(value, name):
    return validate.whole(value, name, high=validate.MAX_SIZE, error=SizingError)


def _dtype_name(value):
    """A dtype as its name: a type (np.float16, jnp.bfloat16) or a NumPy dtype too, and any
    float8 variant (``float8_e4m3fn``) as ``float8``, which is all its size needs."""
    if isinstance(value, (type, np.dtype)):
        try:
            value = np.dtype(value).name
        except TypeError:  # a type that is no dtype: refused by name below
            pass
    if (
        isinstance(value, str)
        and value.startswith("float8_")
        and hasattr(ml_dtypes, value)
        and ml_dtypes.finfo(getattr(ml_dtypes, value)).nmant > 0  # e8m0: scales, not weights
    ):
        value = "float8"
    return value


def _dtype(value, name):
    value = _dtype_name(value)
    return validate.choice(value, list(DTYPE_BYTES), f"a {name}", error=SizingError)


@validate.impostors_refused
def plan(
    model: Transformer,
    *,
    dp: int = 1,
    fsdp: int = 1,
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    ep: int = 1,
    global_batch: int,
    seq: int,
    microbatches: int = 1,
    schedule: str = "gpipe",
    virtual_stages: int = 1,
    param_dtype: str = "float32",
    grad_dtype: str = "float32",
    moment_dtype: str = "float32",
    compute_dtype: str = "bfloat16",
    optimizer: str = "adamw",
    remat: str = "full",
    sequence_parallel: bool = False,
    gradient_reduce: str = "reduce-scatter",
    zero: int = 0,
    fused_attention: bool = False,
    capacity_factor: float | None = None,
) -> Plan:
    """Memory and communication per device of one training step of ``model`` in this layout.

    Conventions, each an argument:

    - parameters, gradients and the optimizer's moments are held in ``param_dtype``,
      ``grad_dtype`` and ``moment_dtype``, sharded alike (AdamW keeps two moments and a step
      count, SGD nothing); activations, what TP sends and what PP sends between stages are in
      ``compute_dtype``;
      FSDP gathers parameters in ``param_dtype`` and reduces gradients in ``grad_dtype``;
    - ``global_batch`` sequences of ``seq`` tokens per step, split over ``dp x fsdp`` and run
      as ``microbatches`` (gradient accumulation, or the pipeline's microbatches);
    - ``remat="full"`` keeps each layer's input for the backward pass and recomputes the rest
      (a forward pass more of FLOPs); ``"minimal"`` (MaxText's name; for these blocks its
      named projections are what JAX's ``dots_with_no_batch_dims_saveable`` saves) also
      keeps the outputs of the matrix products with weights that the backward pass reads,
      and recomputes the attention's scores, softmax and context and the elementwise work
      (the attention's forward FLOPs again);
      ``"none"`` keeps everything the backward pass reads, as JAX differentiates chapter
      13's block (a gated MLP is counted like its GELU MLP, an estimate); each keeps,
      outside the layers, four arrays of the residual stream and the logits;
    - ``fused_attention=True`` counts a fused attention kernel (FlashAttention's, cuDNN's or
      Pallas's splash attention): it never writes the scores, and its backward pass keeps Q,
      K, V, the output and one log-sum-exp per head and token, and recomputes the scores
      (one product of Q and K again, a sixth of the attention's FLOPs);
    - ``sequence_parallel`` splits the residual stream between sublayers by its sequence over
      ``tp`` (chapter 13): the layers' inputs and the stream outside the layers are kept split,
      and TP's all-reduces become all-gathers and reduce-scatters of the same bytes;
    - FSDP gathers each layer's weights once forward and once backward and reduces its
      gradients, per microbatch; ``gradient_reduce="all-reduce"`` counts an all-reduce where
      the textbook has a reduce-scatter (what XLA compiles for CPU devices);
    - DP all-reduces every gradient a device holds once a step; ``zero=1`` (ZeRO-1, chapter
      16) splits the optimizer's state over ``dp`` instead of copying it, so DP
      reduce-scatters the gradients and all-gathers the updated parameters (the same bytes
      where ``param_dtype`` and ``grad_dtype`` agree); ``zero=2`` (ZeRO-2) splits the
      gradients too, so each microbatch's gradients are reduce-scattered as the backward
      pass makes them, ``microbatches`` times a step (ZeRO-3 is FSDP, ``fsdp``);
    - TP all-reduces the residual stream four times per layer (twice forward, twice
      backward), a fifth time under full remat (the recomputed attention's output, which the
      recomputed MLP reads; with sequence parallelism the recomputation also gathers the
      layer's input), and twice more for the embedding and the unembedding;
    - ``cp`` (Ulysses context parallelism, DeepSpeed-Ulysses) splits every microbatch's
      sequence over ``cp`` devices, which hold the weights whole (as DP does); around each
      layer's attention an all-to-all takes Q, K and V from the sequence split to a split of
      the K/V head groups (``kv_heads / tp`` of them, which ``cp`` must divide), attention
      runs on whole sequences, and a second all-to-all brings the output back to the
      sequence split before the output projection: ``book.cost.ulysses_bytes`` of the
      microbatch's tokens in the data-parallel group, with ``heads / tp`` and ``kv_heads /
      tp`` heads, per layer and microbatch, three times under full and minimal remat
      (forward, recomputation, transpose) and twice without; every gradient a device holds is
      all-reduced over ``cp`` once a step, a collective of its own before DP's all-reduce
      over ``dp`` (as XLA compiles it: two all-reduces, not one over ``dp x cp``). Each
      device keeps the activations of ``1 / cp`` of the tokens, and TP's and PP's arrays of
      the stream are ``1 / cp`` as large;
    - PP runs chapter 14's schedule: ``microbatches + pp - 1`` steps, at each of which every
      stage sends a microbatch's activations forward and, in the backward pass, their
      gradients back; each stage holds ``layers / pp`` layers and, as in chapter 14, the
      embedding, final norm and unembedding: over ``pp`` it all-reduces the final norm's
      and unembedding's gradients, and the embedded tokens' gradient (in the compute dtype),
      from which each stage computes the embedding's; with ``schedule="gpipe"`` the stages
      keep every microbatch's activations until its backward pass (GPipe's order, chapter
      14's scan), with ``"1f1b"`` at most ``pp`` microbatches' (the first stage's peak in
      1F1B's order; its steps, bubble and bytes sent are GPipe's), with ``"interleaved"``
      Megatron-LM's interleaved 1F1B: each stage holds ``virtual_stages`` (v) groups of
      ``layers / (pp v)`` layers, the first stage keeps at most ``pp + (pp - 1) / v``
      microbatches' activations (chapter 14), the bubble shrinks to ``(pp - 1) / v`` of
      ``microbatches`` steps and each stage sends at each of ``v microbatches + pp - 1``
      steps, ``v`` times GPipe's transfers. Chapter 14's
      program also runs its layers, and their FSDP and TP collectives, at its ``pp - 1``
      idle steps, and keeps those steps' activations; tests/compiled_plans.py accounts for both;
    - ``ep`` (expert parallelism, chapter 21; a model with ``experts``) splits the experts over
      ``ep`` devices and the batch over ``dp x fsdp x ep``; the other weights are replicated
      over ``ep``. Per layer and microbatch each device sends ``moe_all_to_all_bytes`` of its
      tokens (dropless blocks of ``tokens x min(top_k, experts / ep)`` rows, or with
      ``capacity_factor`` the capacity's; in ``compute_dtype``): forward the tokens out, the
      results back and each expert's count of rows (int32), backward the transposes of the
      two; under full and minimal remat the forward's three again (the blocks' products are
      no dots ``"minimal"`` saves). The experts' gradients are all-reduced over ``dp``; every
      other gradient a device holds over ``dp x ep``, in one all-reduce of ``dp x ep``
      devices (as XLA compiles chapter 21's step; kind ``"dp"``, on DP's link, where
      ``dp > 1``, else kind ``"ep"``). Kept for the backward pass: under minimal remat the
      router's logits in place of the MLP's products; without remat, per token, the gathered
      results of its ``top_k`` experts (arrays of the stream) and the router's probabilities,
      and per device the received blocks (``ep`` blocks of rows) twice and their hidden units
      five times, in place of the dense MLP's. Model FLOPs count ``top_k`` experts per token;
      a dropless layer's dense compute on hardware without a ragged product (XLA:CPU runs
      every expert's product over every row) is the implementation's, not modelled.
      ``ep`` is planned with ``dp`` and ``fsdp`` only.
    """
    _check_model(model)
    layout = {
        k: _whole(v, k)
        for k, v in (("dp", dp), ("fsdp", fsdp), ("cp", cp), ("tp", tp), ("pp", pp), ("ep", ep))
    }
    global_batch = _whole(global_batch, "global_batch")
    # Up to 2**20 tokens a sequence: eight times the longest context window of the presets.
    seq = validate.whole(
        seq, "seq", high=2**20, too_large="longer than any model here reads", error=SizingError
    )
    microbatches = _whole(microbatches, "microbatches")
    dtypes = {
        "param_dtype": _dtype(param_dtype, "parameter dtype"),
        "grad_dtype": _dtype(grad_dtype, "gradient dtype"),
        "moment_dtype": _dtype(moment_dtype, "moment dtype"),
        "compute_dtype": _dtype(compute_dtype, "compute dtype"),
    }
    optimizer = validate.choice(
        optimizer, list(OPTIMIZER_MOMENTS), "an optimizer", error=SizingError
    )
    remat = validate.choice(remat, list(REMAT), "a remat policy", error=SizingError)
    schedule = validate.choice(schedule, list(SCHEDULES), "a pipeline schedule", error=SizingError)
    v = _whole(virtual_stages, "virtual_stages")
    if (v > 1) != (schedule == "interleaved"):
        raise SizingError(
            'schedule="interleaved" needs virtual_stages of 2 or more, and the other schedules '
            f"one group of layers per stage; virtual_stages={v} does not fit {schedule!r}."
        )
    sequence_parallel = validate.flag(sequence_parallel, "sequence_parallel", error=SizingError)
    zero = validate.whole(
        zero,
        "zero, the ZeRO stage,",
        low=0,
        high=2,
        example=1,
        too_large="a stage the calculator writes as fsdp (ZeRO-3 is FSDP)",
        error=SizingError,
    )
    fused = validate.flag(fused_attention, "fused_attention", error=SizingError)
    gradient_reduce = validate.choice(
        gradient_reduce, list(GRADIENT_REDUCE), "a gradient reduction", error=SizingError
    )
    if math.prod(layout.values()) > validate.MAX_DEVICES:
        raise SizingError(
            f"The layout needs {math.prod(layout.values()):,} devices; use at most "
            f"{validate.MAX_DEVICES:,}."
        )
    capacity_factor = _check_ep(model, layout, sequence_parallel, zero, capacity_factor)
    split = layout["dp"] * layout["fsdp"] * layout["ep"] * microbatches
    if global_batch % split:
        over = "dp x fsdp x ep" if layout["ep"] > 1 else "dp x fsdp"
        raise SizingError(
            f"A global batch of {global_batch} sequences does not split evenly over {over} "
            f"x microbatches = {split}; choose a multiple of {split}."
        )
    if layout["tp"] > model.kv_heads:
        raise SizingError(
            f"tp={layout['tp']} is more than the model's {model.kv_heads} K/V heads, by which TP "
            "splits Q, K and V (chapter 13); choose a tp of at most "
            f"{model.kv_heads}."
        )
    _check_cp(model, layout, seq, sequence_parallel, zero)
    if model.layers % (layout["pp"] * v):
        raise SizingError(
            f"{model.layers} layers do not split into {layout['pp']} pipeline stages of {v} "
            "groups; choose a pp and virtual_stages whose product divides the number of layers."
        )
    if v > 1 and microbatches < layout["pp"]:  # the program's own assertion, chapter 14
        raise SizingError(
            f'schedule="interleaved" needs at least pp={layout["pp"]} microbatches, not '
            f"{microbatches}, so that a microbatch is back at the first stage for its next trip."
        )
    conventions = {
        "microbatches": microbatches,
        "schedule": schedule,
        "virtual_stages": v,
        **dtypes,
        "optimizer": optimizer,
        "remat": remat,
        "sequence_parallel": sequence_parallel,
        "gradient_reduce": gradient_reduce,
        "zero": zero,
        "fused_attention": fused,
    }
    if model.experts:
        conventions["capacity_factor"] = capacity_factor
    b = {k: DTYPE_BYTES[v] for k, v in dtypes.items()}
    arrays = _arrays(model)
    local_layers = model.layers // layout["pp"]
    per_layer = sum(_held(*a, layout) for n, a in arrays.items() if n.startswith("layer."))
    ends = {n: _held(*a, layout) for n, a in arrays.items() if not n.startswith("layer.")}
    held = local_layers * per_layer + sum(ends.values())  # PP: the ends on every stage

    # Per data-parallel group and step: its sequences, and one microbatch of them; a device
    # holds 1 / cp of the microbatch's positions (Ulysses splits the sequence over cp). EP
    # splits the batch too.
    tokens = global_batch // (layout["dp"] * layout["fsdp"] * layout["ep"]) * seq
    micro_tokens = tokens // microbatches
    device_tokens = micro_tokens // layout["cp"]
    act = b["compute_dtype"]
    stream = device_tokens * model.d_model * act
    memory = {
        "params": held * b["param_dtype"],
        "grads": (math.ceil(held / layout["dp"]) if zero >= 2 else held) * b["grad_dtype"],
        "optimizer": OPTIMIZER_MOMENTS[optimizer]
        * (math.ceil(held / layout["dp"]) if zero else held)
        * b["moment_dtype"]
        + (4 if optimizer == "adamw" else 0),
        "activations": _activations(
            model, layout, local_layers, device_tokens, seq, act, remat, sequence_parallel, fused
        )
        + _moe_activations(model, layout, local_layers, device_tokens, act, remat, capacity_factor),
    }
    p = layout["pp"]
    if p > 1:  # GPipe holds every microbatch's activations, 1F1B at most pp, and the
        # interleaved schedule at most (v + 1) p - 1 groups of 1/v of a microbatch's
        groups = {"gpipe": v * microbatches, "1f1b": v * min(microbatches, p)}
        held_groups = groups.get(schedule, min((v + 1) * p - 1, v * microbatches))
        memory["activations"] = memory["activations"] * held_groups // v
    memory["total"] = sum(memory.values())

    collectives = []

    def add(kind, op, what, nbytes, count, in_layers=True, n=None):
        n = layout[kind] if n is None else n  # a collective over dp x ep: dp x ep devices
        if n > 1 and count:
            formula = {
                "all-gather": cost.all_gather_bytes,
                "reduce-scatter": cost.reduce_scatter_bytes,
                "all-reduce": cost.all_reduce_bytes,
            }
            sent = formula[op](nbytes, n) if op in formula else float(nbytes)
            collectives.append(Collective(kind, op, what, sent, count, n, in_layers))

    # TP: the stream all-reduced 4 times a layer, a fifth under full remat, and once each for
    # embedding and unembedding; with SP the recomputation gathers the layer's input too.
    reductions = 5 if remat == "full" else 4
    add("tp", "all-reduce", "residual stream", stream, microbatches * reductions * local_layers)
    if remat == "full" and sequence_parallel:
        add("tp", "all-gather", "recomputed layer input", stream, microbatches * local_layers)
    add("tp", "all-reduce", "embedding and unembedding", stream, 2 * microbatches, False)
    # FSDP: one layer's weights after TP splits them, gathered whole over fsdp, twice.
    no_fsdp = {**layout, "fsdp": 1}
    layer_tp = sum(_held(*a, no_fsdp) for n, a in arrays.items() if n.startswith("layer."))
    ends_tp = sum(_held(*a, no_fsdp) for n, a in arrays.items() if not n.startswith("layer."))
    for what, elements, count, inside in (
        ("a layer's weights", layer_tp, local_layers, True),
        ("embedding, unembedding, final norm", ends_tp, 1, False),
    ):
        gathered, reduced = elements * b["param_dtype"], elements * b["grad_dtype"]
        add("fsdp", "all-gather", what, gathered, 2 * count * microbatches, inside)
        add("fsdp", gradient_reduce, f"{what}: gradients", reduced, count * microbatches, inside)
    # CP (Ulysses): per layer and microbatch, an all-to-all of Q, K and V (sequence split to
    # head split) and one of the attention's output (back), in the forward pass, again in
    # the recomputation (full and minimal remat: the context wo reads is recomputed), and
    # transposed in the backward pass. The weights are replicated over cp: every gradient a
    # device holds is all-reduced over cp once a step, before (and apart from) DP's.
    cp = layout["cp"]
    if cp > 1:
        kv = model.kv_heads // layout["tp"]
        heads = kv * (model.heads // model.kv_heads)
        q = micro_tokens * heads * model.head_dim * act  # Q, and the output, of the group
        k_v = 2 * micro_tokens * kv * model.head_dim * act
        passes = 2 if remat == "none" else 3
        count = passes * microbatches * local_layers
        add("cp", "all-to-all", "Q, K and V", cost.all_to_all_bytes(q + k_v, cp), count)
        add("cp", "all-to-all", "the attention's output", cost.all_to_all_bytes(q, cp), count)
        add("cp", "all-reduce", "a layer's gradients", per_layer * b["grad_dtype"], local_layers)
        ends_grads = (held - local_layers * per_layer) * b["grad_dtype"]
        add("cp", "all-reduce", "the ends' gradients", ends_grads, 1, False)
    # EP: per layer and microbatch, the tokens out to their experts and the results back
    # (forward, the recomputation under full and minimal remat, and transposed backward), and
    # each expert's count of rows (forward and recomputation).
    if layout["ep"] > 1:
        sent = moe_all_to_all_bytes(
            device_tokens, top_k=model.top_k, d_model=model.d_model, experts=model.experts,
            expert_parallel=layout["ep"], capacity_factor=capacity_factor,
            dtype=dtypes["compute_dtype"],
        )  # fmt: skip
        blocks = sent["backward"] / 2
        passes = 2 if remat == "none" else 3
        count = passes * microbatches * local_layers
        add("ep", "all-to-all", "the tokens out to their experts", blocks, count)
        add("ep", "all-to-all", "the experts' results back", blocks, count)
        counts = sent["forward"] - sent["backward"]
        count = (passes - 1) * microbatches * local_layers  # the forward's, not transposed
        add("ep", "all-to-all", "each expert's count of rows", counts, count)
    # DP: every gradient a device holds, all-reduced once a step, layer by layer; under
    # ZeRO reduce-scattered (ZeRO-2: each microbatch's), and the parameters each device
    # updated gathered.
    ends_held = held - local_layers * per_layer
    reduced = (("a layer's", per_layer, local_layers, True), ("the ends'", ends_held, 1, False))
    if layout["ep"] > 1:  # the experts' over dp; the rest over dp x ep, in one all-reduce
        experts = _held(*arrays["layer.experts"], layout)
        reduced = (("a layer's experts'", experts, local_layers, True),)
        kind, n = ("dp" if layout["dp"] > 1 else "ep"), layout["dp"] * layout["ep"]
        shared = (per_layer - experts) * b["grad_dtype"]
        add(kind, "all-reduce", "a layer's other gradients", shared, local_layers, n=n)
        add(kind, "all-reduce", "the ends' gradients", ends_held * b["grad_dtype"], 1, False, n=n)
    for what, elements, count, inside in reduced:
        grads = elements * b["grad_dtype"]
        if zero:
            times = count * (microbatches if zero == 2 else 1)
            add("dp", "reduce-scatter", f"{what} gradients", grads, times, inside)
            gathered = elements * b["param_dtype"]
            add("dp", "all-gather", f"{what} updated parameters", gathered, count, inside)
        else:
            add("dp", "all-reduce", f"{what} gradients", grads, count, inside)
    # PP: a microbatch's activations forward and their gradients back, at every schedule step;
    # under SP each TP rank sends the part of the sequence it holds (Megatron-LM's scatter and
    # gather), which no compiled program here checks: chapter 14's pipeline runs without SP.
    steps = v * microbatches + layout["pp"] - 1
    boundary = stream // layout["tp"] if sequence_parallel else stream
    add("pp", "collective-permute", "activations and their gradients", boundary, 2 * steps, False)
    # The ends, replicated over stages: the final norm's and unembedding's gradients as held,
    # and the embedded tokens' gradient, from which every stage computes the embedding's.
    head = (ends["final_norm"] + ends["unembed"]) * b["grad_dtype"]
    add("pp", "all-reduce", "the final norm's and unembedding's gradients", head, 1, False)
    add("pp", "all-reduce", "the embedded tokens' gradient", stream * microbatches, 1, False)
    comm = dict.fromkeys(KINDS, 0.0)
    for c in collectives:
        comm[c.kind] += c.sent * c.count

    all_tokens = global_batch * seq
    matmul_params = param_count(model) - model.vocab * model.d_model  # the lookup is free
    if model.experts:  # each token runs top_k of the experts (model FLOPs, not the program's)
        idle = model.experts - model.top_k
        matmul_params -= model.layers * idle * _arrays(model)["layer.experts"][0] // model.experts
    attention = 6 * model.layers * model.heads * model.head_dim * seq * all_tokens
    model_flops = 6 * matmul_params * all_tokens + attention  # causal: half the scores
    recompute = {"full": 2 * matmul_params * all_tokens + attention / 3, "minimal": attention / 3}
    rescore = attention / 6 if fused else 0  # a fused backward's second product of Q and K
    bubble = (microbatches + (layout["pp"] - 1) / v) / microbatches
    hardware = (model_flops + recompute.get(remat, 0) + rescore) * bubble
    flops = {"model": model_flops, "hardware": hardware}  # cp splits both evenly
    return Plan(
        model, layout, global_batch, seq, conventions, memory, comm, tuple(collectives), flops
    )


def _refuse_unchecked(what: str, **others: bool) -> None:
    """Refuse ``what`` beside a layout no compiled program has checked it with."""
    for other, on in others.items():
        if on:
            raise SizingError(
                f"{what} with {other} is not planned (not checked against a compiled "
                f"program); leave {other} out."
            )


def _check_cp(model, layout, seq, sequence_parallel, zero):
    """Refuse, in one sentence, a cp the calculator cannot plan."""
    cp, tp = layout["cp"], layout["tp"]
    if cp == 1:
        return
    if model.kv_heads % tp or (model.kv_heads // tp) % cp:
        raise SizingError(
            f"cp={cp} does not divide the {model.kv_heads} K/V heads over tp={tp}: Ulysses gives "
            "each device whole K/V heads (and the query heads that share them); choose a cp "
            "that divides kv_heads / tp."
        )
    if seq % cp:
        raise SizingError(
            f"A sequence of {seq} tokens does not split evenly over cp={cp}; choose a multiple "
            f"of {cp}."
        )
    _refuse_unchecked(
        f"cp={cp}", pp=layout["pp"] > 1, sequence_parallel=sequence_parallel, zero=zero
    )


def _check_ep(model, layout, sequence_parallel, zero, capacity_factor):
    """Refuse, in one sentence, an ep the calculator cannot plan; the capacity factor checked."""
    ep = layout["ep"]
    if not model.experts:
        if ep > 1 or capacity_factor is not None:
            what = f"ep={ep}" if ep > 1 else "capacity_factor"
            raise SizingError(
                f"{what} needs a model with experts; give the Transformer experts (and top_k)."
            )
        return None
    if model.experts % ep:
        raise SizingError(
            f"{model.experts} experts do not split evenly over ep={ep}; choose an ep that "
            f"divides {model.experts}."
        )
    _refuse_unchecked(
        "A model with experts",
        tp=layout["tp"] > 1,
        cp=layout["cp"] > 1,
        pp=layout["pp"] > 1,
        sequence_parallel=sequence_parallel,
        zero=zero,
    )
    if capacity_factor is None:
        return None
    return validate.number(
        capacity_factor,
        "capacity_factor",
        above=True,
        high=1e6,
        wanted="a number above 0 such as 1.25, or None for dropless",
        error=SizingError,
    )


def _moe_activations(m, layout, layers, tokens, act, remat, capacity_factor) -> int:
    """Bytes one device keeps from its expert layers for the backward pass, past the rest.

    Full remat keeps each layer's input only (``_activations``). Minimal remat keeps the
    router's logits (a dot with no batch dimensions); the experts' products are ragged dots,
    which the policy does not save. Without remat, per token the router's probabilities and
    the ``top_k`` results gathered back from the experts (arrays of the stream), and per
    device the blocks it received (``ep`` blocks of ``rows``, chapter 21's worst case or the
    capacity's): their rows of ``d_model`` twice and their hidden units five times (as a
    dense GELU MLP's five arrays of its hidden units).
    """
    if not m.experts or remat == "full":
        return 0
    if remat == "minimal":
        return layers * tokens * m.experts * act
    ep, local = layout["ep"], m.experts // layout["ep"]
    if capacity_factor is None:
        rows = min(m.top_k, local) * tokens
    else:
        rows = local * math.ceil(capacity_factor * m.top_k * tokens / m.experts)
    per_token = (m.top_k * m.d_model + m.experts) * act
    return layers * (tokens * per_token + ep * rows * (2 * m.d_model + 5 * m.d_ff) * act)


def _activations(m, layout, layers, tokens, seq, act, remat, sp, fused) -> int:
    """Bytes one device keeps from the forward pass for the backward pass.

    ``tokens`` are one device's: with cp, ``1 / cp`` of a microbatch's positions. Inside
    Ulysses attention a device holds whole sequences of ``1 / cp`` of the heads instead, the
    same number of elements, so every per-token count below holds as it is.

    Per layer under full remat, the layer's input (the residual stream, whole on every TP
    device, or split by sequence parallelism). Under minimal remat, per token, the layer's
    input and the attention's output projection (arrays of the stream), Q, K and V, and the
    MLP's hidden units before the activation (twice for a gated MLP: the gate and the up
    projection). Without remat, what JAX keeps from chapter
    13's block, per token: six arrays of the stream and four numbers of its norms, Q and the
    attention's context (heads), K and V, the attention's scores and weights (``heads x
    seq``, split by TP) and two statistics per head, and five arrays of the MLP's hidden
    units; a fused attention kernel keeps one log-sum-exp per head in place of the scores,
    weights and statistics. Sequence parallelism splits every array of the stream a layer
    keeps. Outside the layers, four arrays of the stream (three split by sequence
    parallelism; the last, the unembedding's input, gathered whole) and the logits (in the
    compute dtype; the loss's float32 copy is transient).
    """
    tp = layout["tp"]
    d, dh = m.d_model, m.head_dim
    stream = math.ceil(d / tp) if sp else d
    kv, ff = math.ceil(m.kv_heads / tp), math.ceil(m.d_ff / tp)
    ff = 0 if m.experts else ff  # experts: _moe_activations
    heads = kv * (m.heads // m.kv_heads)  # TP splits the heads by K/V groups
    if remat == "full":
        per_token = stream * act
    elif remat == "minimal":  # a gated MLP keeps both input products, gate and up
        per_token = (2 * stream + heads * dh + 2 * kv * dh + (2 if m.gated else 1) * ff) * act
    else:
        softmax = heads if fused else 2 * heads * seq + 2 * heads
        attention = 2 * heads * dh + 2 * kv * dh + softmax
        per_token = (6 * stream + 4 + attention + 5 * ff) * act
    vocab = math.ceil(m.vocab / tp)
    return tokens * (layers * per_token + (3 * stream + d + vocab) * act)


# Serving (chapter 20): the KV cache, and a decode step's time bound.

SERVE_DTYPE_BYTES = {**DTYPE_BYTES, "int8": 1}
SERVE_KINDS = ("dp", "fsdp", "cp", "tp")
# Axes from the innermost outwards, as for training: TP on the fastest links, then the cache's
# positions (context parallelism), FSDP and DP.
SERVE_INNER_TO_OUTER = ("tp", "cp", "fsdp", "dp")


@validate.impostors_refused
def kv_cache_bytes(model: Transformer, tokens: int, dtype: str = "bfloat16") -> int:
    """Bytes of the KV cache for ``tokens`` tokens: a key and a value per K/V head and layer.

    Llama 3 70B in int8 holds 163,840 bytes a token (the scaling book's "160kB").
    """
    _check_model(model)
    tokens = _whole(tokens, "tokens")
    dtype = _dtype_name(dtype)
    dtype = validate.choice(dtype, list(SERVE_DTYPE_BYTES), "a cache dtype", error=SizingError)
    per_token = 2 * model.layers * model.kv_heads * model.head_dim
    return per_token * tokens * SERVE_DTYPE_BYTES[dtype]


@dataclass(frozen=True)
class DecodeSeconds:
    """A decode step's time on some hardware, in seconds, at peak FLOP/s and bandwidths.

    ``compute`` is the step's FLOPs per device over the chip's peak; ``memory`` the bytes each
    device reads from HBM (its weights and its part of the cache) over HBM bandwidth; ``comm``
    each kind's collectives on its link. ``bound`` is the longest of them: the step at best,
    every collective hidden behind the reads. ``serial`` adds the collectives to the longer of
    compute and memory: in decode each layer's all-reduce waits for that layer's matmuls and
    the next layer waits for it, so little hides; it is the nearer figure when ``comm`` is not
    small. Both leave out NCCL's fixed cost per collective and assume peak HBM bandwidth, which
    servers reach only part of. ``per_user`` is tokens per second each sequence gets (one
    token per ``bound``), ``per_chip`` the tokens per second of the whole batch over the chips.
    """

    compute: float
    memory: float
    comm: dict
    links: dict
    bound: float
    serial: float
    per_user: float
    per_chip: float


@dataclass(frozen=True)
class ServePlan:
    """Memory per device (bytes), bytes read and FLOPs per decode step, and what it sends."""

    model: Transformer
    layout: dict
    batch: int
    context: int
    conventions: dict
    memory: dict
    read: dict
    flops: float
    comm: dict
    collectives: tuple = field(repr=False)

    @property
    def devices(self) -> int:
        return math.prod(self.layout.values())

    def links(self, hardware: Hardware) -> dict:
        """Which link each kind's axis runs over, filling the fast domain from the inside."""
        return _links(self.layout, SERVE_INNER_TO_OUTER, _chip(hardware))

    def decode_seconds(self, hardware) -> DecodeSeconds:
        """The decode step's compute, memory and communication times, and its bound."""
        hardware = _hardware(hardware)
        links = self.links(hardware)
        comm = _comm_seconds(self.collectives, links, SERVE_KINDS)
        compute = self.flops / hardware.peak_flops
        memory = (self.read["weights"] + self.read["cache"]) / hardware.hbm_bandwidth
        bound = max(compute, memory, *comm.values())
        serial = max(compute, memory) + sum(comm.values())
        kinds = {k: links[k].name for k in SERVE_KINDS}
        per_chip = self.batch / (bound * self.devices)
        return DecodeSeconds(compute, memory, comm, kinds, bound, serial, 1 / bound, per_chip)


def _chip(hardware) -> Hardware:
    """One of ``HARDWARE``, a ``Hardware`` of the reader's own, or a name ``HARDWARE`` has."""
    if isinstance(hardware, str) and str.__str__(hardware) in HARDWARE:
        hardware = HARDWARE[str.__str__(hardware)]
    if not isinstance(hardware, Hardware):
        names = ", ".join(HARDWARE)
        raise SizingError(
            f"Pass one of book.sizing.HARDWARE ({names}) or its name, not "
            f"{validate.describe(hardware)}."
        )
    return hardware


def _hardware(hardware) -> Hardware:
    """A chip serving can be timed on: one whose HBM bandwidth is known."""
    hardware = _chip(hardware)
    if hardware.hbm_bandwidth is None:
        raise SizingError(
            f"{hardware.name} has no HBM bandwidth; give its Hardware an hbm_bandwidth."
        )
    return hardware


@validate.impostors_refused
def serve(
    model: Transformer,
    *,
    batch: int,
    context: int,
    dp: int = 1,
    fsdp: int = 1,
    cp: int = 1,
    tp: int = 1,
    param_dtype: str = "bfloat16",
    cache_dtype: str = "bfloat16",
    compute_dtype: str = "bfloat16",
) -> ServePlan:
    """Memory, bytes read, FLOPs and communication per device of one decode step.

    ``batch`` sequences each add one token to a cache of ``context`` tokens. The layouts are
    chapter 20's: ``dp`` splits the batch and its cache, weights replicated; ``fsdp`` splits
    the batch and the weights' ``d_model``, gathering each layer's weights at every step;
    ``cp`` (context parallelism, which splits the cache by its positions; not Megatron's
    sequence parallelism) leaves batch and weights replicated; ``tp`` splits the
    K/V heads (and with them the cache), the MLP and the vocabulary, as chapter 13.

    Conventions: weights in ``param_dtype``, the cache in ``cache_dtype``, activations and what
    TP and CP send in ``compute_dtype``. A step reads every weight a device uses (under FSDP,
    the gathered layer; the embedding's table is looked up, not read) and the whole cache it
    holds. Per decoded token, TP all-reduces the stream twice a layer, and once for the
    embedding lookup, and gathers each device's best logit and its (int32) index to pick the
    greedy token; CP all-reduces, per layer, each head's softmax
    maximum and sum and its partial attention output; FSDP gathers each layer's weights and,
    once, the unembedding. ``memory`` counts weights and cache only: no working memory for
    activations and none of the headroom a server keeps (vLLM's ``gpu_memory_utilization``
    is 0.9 by default), so whether a plan fits is judged against the whole HBM.
    """
    _check_model(model)
    if model.experts:
        raise SizingError(
            "Serving a model with experts is not planned; give serve a dense Transformer."
        )
    layout = {k: _whole(v, k) for k, v in zip(SERVE_KINDS, (dp, fsdp, cp, tp))}
    batch = _whole(batch, "batch")
    context = validate.whole(
        context,
        "context",
        high=2**20,
        too_large="longer than any model here reads",
        error=SizingError,
    )
    dtypes = {
        name: validate.choice(
            _dtype_name(value),
            list(SERVE_DTYPE_BYTES),
            f"a {name.replace('_', ' ')}",
            error=SizingError,
        )
        for name, value in (
            ("param_dtype", param_dtype),
            ("cache_dtype", cache_dtype),
            ("compute_dtype", compute_dtype),
        )
    }
    if math.prod(layout.values()) > validate.MAX_DEVICES:
        raise SizingError(
            f"The layout needs {math.prod(layout.values()):,} devices; use at most "
            f"{validate.MAX_DEVICES:,}."
        )
    split = layout["dp"] * layout["fsdp"]
    if batch % split:
        raise SizingError(
            f"A batch of {batch} sequences does not split evenly over dp x fsdp = {split}; "
            f"choose a multiple of {split}."
        )
    if layout["tp"] > model.kv_heads:
        raise SizingError(
            f"tp={layout['tp']} is more than the model's {model.kv_heads} K/V heads, by which "
            "this calculator's TP splits the cache (a limit of the calculator, not of the "
            "chips: servers replicate K/V heads or split the cache by batch); choose a tp of "
            f"at most {model.kv_heads}."
        )
    if context % layout["cp"]:
        raise SizingError(
            f"A context of {context} tokens does not split evenly over cp={layout['cp']}; "
            f"choose a multiple of {layout['cp']}."
        )
    b = {k: SERVE_DTYPE_BYTES[v] for k, v in dtypes.items()}
    arrays = _arrays(model)
    degree = {"fsdp": layout["fsdp"], "tp": layout["tp"]}
    held = sum(
        _held(*a, degree) * (model.layers if n.startswith("layer.") else 1)
        for n, a in arrays.items()
    )
    per_layer = {n: _held(*a, {**degree, "fsdp": 1}) for n, a in arrays.items()}
    layer_tp = sum(v for n, v in per_layer.items() if n.startswith("layer."))
    read = model.layers * layer_tp + per_layer["final_norm"] + per_layer["unembed"]

    local_batch = batch // split
    kv_local = math.ceil(model.kv_heads / layout["tp"])
    heads_local = kv_local * (model.heads // model.kv_heads)
    cache = (
        2 * model.layers * local_batch * (context // layout["cp"]) * kv_local * model.head_dim
    ) * b["cache_dtype"]
    memory = {"params": held * b["param_dtype"], "cache": cache}
    memory["total"] = sum(memory.values())

    collectives = []
    act = b["compute_dtype"]
    stream = local_batch * model.d_model * act

    def add(kind, op, what, nbytes, count, in_layers=True):
        n = layout[kind]
        if n > 1 and count:
            formula = {"all-gather": cost.all_gather_bytes, "all-reduce": cost.all_reduce_bytes}
            collectives.append(
                Collective(kind, op, what, formula[op](nbytes, n), count, n, in_layers)
            )

    add("tp", "all-reduce", "residual stream", stream, 2 * model.layers)
    add("tp", "all-reduce", "embedding lookup", stream, 1, False)
    # The greedy pick over a vocabulary split by TP: each device's best logit and its index.
    best = local_batch * layout["tp"] * (act + 4)
    add("tp", "all-gather", "each device's best logit and its index", best, 1, False)
    stats = local_batch * heads_local * act
    add("cp", "all-reduce", "softmax maximum and sum", stats, 2 * model.layers)
    add("cp", "all-reduce", "partial attention output", stats * model.head_dim, model.layers)
    add("fsdp", "all-gather", "a layer's weights", layer_tp * b["param_dtype"], model.layers)
    unembed = per_layer["unembed"] * b["param_dtype"]
    add("fsdp", "all-gather", "the unembedding", unembed, 1, False)
    comm = dict.fromkeys(SERVE_KINDS, 0.0)
    for c in collectives:
        comm[c.kind] += c.sent * c.count

    # FLOPs per device: the matmuls for its sequences with its share of the weights, and
    # attention over its share of the cache (a query against each key, a weight on each value).
    matmul_params = param_count(model) - model.vocab * model.d_model
    matmuls = 2 * matmul_params / layout["tp"] * local_batch
    attention = 4 * model.layers * heads_local * model.head_dim * local_batch
    flops = matmuls + attention * context / layout["cp"]
    return ServePlan(
        model,
        layout,
        batch,
        context,
        dtypes,
        memory,
        {"weights": read * b["param_dtype"], "cache": cache},
        flops,
        comm,
        tuple(collectives),
    )


# Expert parallelism (chapter 21): what a mixture-of-experts layer's all-to-alls send.


@validate.impostors_refused
def moe_all_to_all_bytes(
    tokens: int,
    *,
    top_k: int,
    d_model: int,
    experts: int,
    expert_parallel: int,
    capacity_factor: float | None = None,
    dtype: str = "bfloat16",
    ragged: bool = False,
) -> dict[str, float]:
    """Bytes each device sends in one MoE layer's all-to-alls: ``{"forward": .., "backward": ..}``.

    A dense all-to-all moves buffers whose shape is fixed before the router runs, so what a
    layer sends follows from the sizes alone, however the tokens are routed. A device routes its
    ``tokens`` tokens to ``top_k`` of ``experts`` experts, split evenly over the
    ``expert_parallel`` devices of the expert axis, and sends each of them a block of rows of
    ``d_model`` values in ``dtype``. With ``capacity_factor``, each expert takes
    ``ceil(capacity_factor * top_k * tokens / experts)`` rows from each device and drops the
    rest (chapter 15), and a block holds its device's experts' rows. Dropless
    (``capacity_factor=None``), a block has room for every assignment its device's experts can
    get: a token's ``top_k`` experts are distinct, so one device gets at most
    ``min(top_k, experts / expert_parallel)`` of them, and the block ``tokens`` times that many
    rows (the worst case MaxText's ``get_ragged_buffer_size`` sizes, ``min(expert_parallel,
    experts / top_k)`` times the balanced share). Forward, the tokens go out and the results
    come back, and each expert's count of full rows (an int32) goes out with them; backward,
    the transposes of the two all-to-alls send the same blocks again, without the counts.

    With ``ragged`` (dropless only), the exchanges send only the routed rows, as
    ``ragged_all_to_all`` does; what that is depends on the router, so this counts a balanced
    one, which sends ``top_k * tokens / expert_parallel`` rows to each device.
    """
    tokens = _whole(tokens, "tokens")
    top_k = _whole(top_k, "top_k")
    d_model = _whole(d_model, "d_model")
    experts = _whole(experts, "experts")
    ep = validate.whole(
        expert_parallel, "expert_parallel", high=validate.MAX_DEVICES, error=SizingError
    )
    size = DTYPE_BYTES[_dtype(dtype, "dtype")]
    if top_k > experts:
        raise SizingError(
            f"top_k={top_k} is more than the {experts} experts; choose a top_k of at most "
            f"{experts}."
        )
    if experts % ep:
        raise SizingError(
            f"{experts} experts do not split evenly over expert_parallel={ep}; choose an "
            f"expert_parallel that divides {experts}."
        )
    local = experts // ep
    if validate.flag(ragged, "ragged", error=SizingError) and capacity_factor is not None:
        raise SizingError(
            "A ragged all-to-all sends only the routed rows and drops none; leave "
            "capacity_factor at None with ragged=True."
        )
    if ragged:
        rows = top_k * tokens / ep  # a balanced router: the same share to every device
    elif capacity_factor is None:
        rows = min(top_k, local) * tokens
    else:
        factor = validate.number(
            capacity_factor,
            "capacity_factor",
            above=True,
            high=1e6,
            wanted="a number above 0 such as 1.25, or None for dropless",
            error=SizingError,
        )
        rows = local * math.ceil(factor * top_k * tokens / experts)
    # book.cost's all-to-all takes the global array: ep devices' buffers of ep blocks each.
    if ep * ep * rows * d_model * size > 1e30:
        raise SizingError(
            "These tokens, top_k and d_model make blocks of more bytes than any machine holds; "
            "check the sizes."
        )
    blocks = cost.all_to_all_bytes(ep * ep * rows * d_model * size, ep)
    counts = cost.all_to_all_bytes(ep * experts * 4, ep)
    return {"forward": 2 * blocks + counts, "backward": 2 * blocks}
