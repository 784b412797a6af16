"""Where each part of the model runs: a placement plan, built from settings or from a rules file.

The rules file has the shape of KTransformers' optimize rules (a YAML list of `{match: {name, class}, replace: {class,
kwargs}}`), restricted to what maps onto Tessera. Rules are tried in file order against each part's dotted name; the
first
match wins, as in KTransformers. Unlike KTransformers, nothing is swapped at run time: the rules resolve once into a
`PlacementPlan`, a table a person can read (`tessera-cli generate --explain`, the GUI's details), and
tessera/engine/model.py stays the one description of what runs.

Part names matched (N is each decoder layer):
    model.embed_tokens   model.layers.N.self_attn   model.layers.N.mlp   model.layers.N.mlp.gate
    model.layers.N.mlp.experts   model.norm   lm_head
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from tessera.engine.backends import check_name
from tessera.engine.errors import TesseraError
from tessera.engine.rules_safety import compile_name_pattern, parse_yaml, read_rules_text

# Part kinds and the replacement classes accepted for each: Tessera's own name first, then KTransformers' aliases.
_CLASS_ALIASES: dict[str, tuple[str, ...]] = {
    "embedding": ("Embedding", "default"),
    "attention": (
        "Attention",
        "default",
        "KQwen3MoeAttention",
        "ktransformers.operators.balance_serve_attention.KQwen3MoeAttention",
        "ktransformers.operators.attention.KQwen3MoeAttention",
    ),
    "moe_block": (
        "SparseMoeBlock",
        "default",
        "KQwen3MoeSparseMoeBlock",
        "KQwen3MoeSparseMoeBlockV2",
        "ktransformers.operators.experts.KQwen3MoeSparseMoeBlock",
        "ktransformers.operators.experts.KQwen3MoeSparseMoeBlockV2",
    ),
    "router": (
        "Linear",
        "default",
        "KTransformersLinear",
        "KLinearTorch",
        "ktransformers.operators.linear.KTransformersLinear",
    ),
    "experts": (
        "Experts",
        "KTransformersExperts",
        "KTransformersExpertsV2",
        "ktransformers.operators.experts.KTransformersExperts",
        "ktransformers.operators.experts.KTransformersExpertsV2",
    ),
    "norm": ("RMSNorm", "default", "KQwen3MoeRMSNorm", "ktransformers.operators.layernorm.KQwen3MoeRMSNorm"),
    "lm_head": (
        "Linear",
        "default",
        "KTransformersLinear",
        "KLinearTorch",
        "VLinearMarlin",
        "KLinearMarlin",
        "ktransformers.operators.linear.KTransformersLinear",
    ),
}

# Original-module classes a `match.class` may name (KTransformers matches with isinstance); each maps to a part kind.
_MATCH_CLASSES: dict[str, str] = {
    "torch.nn.Embedding": "embedding",
    "ktransformers.models.modeling_qwen3_moe.Qwen3MoeAttention": "attention",
    "ktransformers.models.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock": "moe_block",
    "ktransformers.models.modeling_qwen3_moe.Qwen3MoeRMSNorm": "norm",
    "torch.nn.Linear": "linear",
}

# kwargs accepted per part kind. Devices are "cpu", "cuda" or "cuda:N".
_KWARGS: dict[str, set[str]] = {
    "embedding": {"generate_device", "prefill_device"},
    "attention": {"generate_device", "prefill_device"},
    "moe_block": {"generate_device", "prefill_device"},
    "router": {"generate_device", "prefill_device", "generate_op", "prefill_op"},
    "norm": {"generate_device", "prefill_device"},
    "lm_head": {"generate_device", "prefill_device", "generate_op", "prefill_op"},
    "experts": {
        "backend", "generate_device", "prefill_device", "generate_op", "prefill_op", "out_device", "gpu_experts",
        "gpu_experts_ratio", "gpu_prefill_threshold",
    },
}
_RULE_KEYS = {"match", "replace", "recursive"}
_MATCH_KEYS = {"name", "class"}
_REPLACE_KEYS = {"class", "kwargs"}
# KTransformers' expert ops: which device each one computes on.
_EXPERT_OPS = {"KExpertsCPU": "cpu", "KExpertsTorch": None, "KExpertsMarlin": "cuda"}
_LINEAR_OPS = {"KLinearTorch", "KLinearMarlin", "VLinearMarlin", "KLinearCPUInfer"}
_DEVICE_RE = re.compile(r"^(cpu|cuda(:\d+)?)$")


@dataclass
class PartPlacement:
    """Where one part runs in each phase."""

    prefill_device: str = "cpu"
    generate_device: str = "cpu"
    rule: str = "default"  # which rule decided it ("rule 2 (line 7)" or "default" or "settings")


@dataclass
class PlacementPlan:
    """The resolved placement: devices of the dense parts, the experts' CPU backend and the GPU expert cache budget.

    `gpu_experts_per_layer` is how many of each MoE layer's experts the hot-expert cache keeps on the accelerator
    (0 = no cache). `accelerator` is "cuda" when any part runs on a CUDA device, else "cpu"; `twin` means the GPU half
    runs
    on the CPU (the CPU twin), with the same code path: set by engine.hybrid.resolve_plan from `engine.load(twin=...)`.
    """

    parts: dict[str, PartPlacement] = field(default_factory=dict)  # keyed by part name, layers expanded
    experts_backend: str = "Auto"
    gpu_experts_per_layer: int = 0
    gpu_experts_ratio: float | None = None
    # Prefill batches of at least this many tokens run all of a layer's routed experts on the accelerator when the
    # experts' prefill_device is the accelerator (KTransformers' layerwise prefill); smaller ones use the CPU backend.
    gpu_prefill_threshold: int | None = None
    twin: bool = False
    source: str = "settings"

    @property
    def accelerator(self) -> str:
        devices = {d for p in self.parts.values() for d in (p.prefill_device, p.generate_device)}
        cuda = sorted(d for d in devices if d.startswith("cuda"))
        return cuda[0] if cuda else "cpu"

    def device_of(self, part: str, phase: str = "generate") -> str:
        p = self.parts[part]
        return p.prefill_device if phase == "prefill" else p.generate_device

    def needs_cuda(self) -> bool:
        return self.accelerator.startswith("cuda") and not self.twin

    def resolve_gpu_experts(self, num_experts: int) -> int:
        """Experts per layer the cache holds, given the model's expert count."""
        if self.gpu_experts_ratio is not None:
            return max(0, min(num_experts, round(self.gpu_experts_ratio * num_experts)))
        return max(0, min(num_experts, self.gpu_experts_per_layer))

    def rows(self) -> list[tuple[str, str, str, str]]:
        """(parts, prefill device, generate device, decided by) in forward order, identical layers merged into one
        row."""
        layer_re = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
        rows: list[list] = []  # [name or (suffix, devices, rule), layers]
        group_at: dict[tuple, int] = {}
        for name, p in self.parts.items():
            m = layer_re.match(name)
            if not m:
                rows.append([(name, p.prefill_device, p.generate_device, p.rule), None])
                continue
            key = (m.group(2), p.prefill_device, p.generate_device, p.rule)
            if key not in group_at:
                group_at[key] = len(rows)
                rows.append([key, []])
            rows[group_at[key]][1].append(int(m.group(1)))
        out = []
        for key, layers in rows:
            name = key[0] if layers is None else f"model.layers.{_spans(layers)}.{key[0]}"
            out.append((name, key[1], key[2], key[3]))
        return out

    def explain(self, num_experts: int | None = None) -> str:
        """The plan as a plain-text table."""
        rows = [("part", "prefill", "generate", "decided by")] + self.rows()
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = [f"Placement plan (from {self.source})"]
        for r in rows:
            lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        gpu = self.resolve_gpu_experts(num_experts) if num_experts else self.gpu_experts_per_layer
        where = "CPU twin" if self.twin else self.accelerator
        lines.append(f"  routed experts: CPU backend {self.experts_backend}; "
                     + (f"hot-expert cache: {gpu} experts per layer on {where}" if gpu else "no GPU expert cache"))
        if self.gpu_prefill_threshold is not None:
            lines.append(f"  prefill of {self.gpu_prefill_threshold}+ tokens: all routed experts of a layer on {where}")
        return "\n".join(lines)


def _spans(xs: list[int]) -> str:
    xs = sorted(xs)
    spans, start, prev = [], xs[0], xs[0]
    for x in xs[1:]:
        if x != prev + 1:
            spans.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = x
        prev = x
    spans.append(f"{start}" if start == prev else f"{start}-{prev}")
    return "{" + ",".join(spans) + "}" if len(spans) > 1 or "-" in spans[0] else spans[0]


def part_names(num_layers: int, moe_layers: list[bool]) -> list[tuple[str, str]]:
    """(part name, kind) for every placeable part of a model, in forward order."""
    parts = [("model.embed_tokens", "embedding")]
    for i in range(num_layers):
        parts.append((f"model.layers.{i}.self_attn", "attention"))
        parts.append((f"model.layers.{i}.mlp", "moe_block"))
        if moe_layers[i]:
            parts.append((f"model.layers.{i}.mlp.gate", "router"))
            parts.append((f"model.layers.{i}.mlp.experts", "experts"))
    parts += [("model.norm", "norm"), ("lm_head", "lm_head")]
    return parts


def plan_from_settings(
    num_layers: int,
    moe_layers: list[bool],
    *,
    device: str = "cpu",
    backend: str = "Auto",
    gpu_experts_per_layer: int = 0,
) -> PlacementPlan:
    """The plan the settings panel describes: dense parts on `device`, experts on the CPU backend, a hot-expert
    cache."""
    _check_device(device, "setting device")
    # The backend name is checked where it is built (engine.native.make_backend names what is wrong, and also
    # accepts the test-only emulated AMX backends), not here.
    plan = PlacementPlan(experts_backend=backend, gpu_experts_per_layer=gpu_experts_per_layer,
                         source="settings")
    for name, kind in part_names(num_layers, moe_layers):
        d = "cpu" if kind == "experts" else device
        plan.parts[name] = PartPlacement(d, d, "settings")
    if gpu_experts_per_layer < 0:
        raise TesseraError("setting gpu_experts_per_layer", "must be 0 or more")
    return plan


@dataclass
class _Rule:
    index: int
    line: int
    name_re: re.Pattern | None
    match_kind: str | None
    replace_class: str
    kwargs: dict

    @property
    def label(self) -> str:
        return f"rule {self.index + 1} (line {self.line})"


def load_rules(path: str | Path) -> list[_Rule]:
    """Parse and validate a rules file; every error names the file and the rule."""
    # size-capped, UTF-8, regular file (tessera/engine/rules_safety.py)
    return parse_rules(read_rules_text(path), str(path))


def parse_rules(text: str, source: str = "<rules>") -> list[_Rule]:
    data, root = parse_yaml(text, source)  # once, no aliases, bounded depth
    if data is None:
        raise TesseraError(source, "no rules: the file is empty")
    if not isinstance(data, list):
        raise TesseraError(source, "placement rules must be a YAML list of {match, replace} entries")
    rules = []
    for i, (item, node) in enumerate(zip(data, root.value)):
        line = node.start_mark.line + 1
        where = f"{source}: rule {i + 1} (line {line})"
        if not isinstance(item, dict):
            raise TesseraError(where, "a rule must be a mapping with `match` and `replace`")
        _no_unknown(item, _RULE_KEYS, where)
        match, replace = item.get("match"), item.get("replace")
        if not isinstance(match, dict) or not match:
            raise TesseraError(where, "`match` is missing or empty (it needs `name` and/or `class`)")
        if not isinstance(replace, dict) or "class" not in replace:
            raise TesseraError(where, "`replace` is missing or has no `class`")
        _no_unknown(match, _MATCH_KEYS, where + " match")
        _no_unknown(replace, _REPLACE_KEYS, where + " replace")
        name_re = None
        if "name" in match:
            name_re = compile_name_pattern(match["name"], where)  # RE2: linear time
        match_kind = None
        if "class" in match:
            match_kind = _MATCH_CLASSES.get(str(match["class"]))
            if match_kind is None:
                raise TesseraError(where, f"match.class {match['class']!r} is not a module Tessera knows; known: "
                                   + ", ".join(sorted(_MATCH_CLASSES)))
        kwargs = replace.get("kwargs") or {}
        if not isinstance(kwargs, dict):
            raise TesseraError(where, "replace.kwargs must be a mapping")
        rules.append(_Rule(i, line, name_re, match_kind, str(replace["class"]), dict(kwargs)))
    return rules


def plan_from_rules(
    rules: list[_Rule], num_layers: int, moe_layers: list[bool], *, source: str = "<rules>"
) -> PlacementPlan:
    """Resolve rules against a model's parts: first matching rule wins; unmatched parts stay on the CPU."""
    plan = PlacementPlan(source=source)
    used_backend: tuple[str, str] | None = None
    gpu_experts: tuple[object, str] | None = None
    for name, kind in part_names(num_layers, moe_layers):
        placement = PartPlacement("cpu", "cpu", "default")
        for rule in rules:
            if rule.name_re is not None and not rule.name_re.search(name):
                continue
            if rule.match_kind is not None and not _kind_matches(rule.match_kind, kind):
                continue
            where = f"{source}: {rule.label}"
            if rule.replace_class not in _CLASS_ALIASES[kind]:
                raise TesseraError(where, f"class {rule.replace_class!r} cannot replace {name} ({kind}); accepted: "
                                   + ", ".join(_CLASS_ALIASES[kind]))
            _no_unknown(rule.kwargs, _KWARGS[kind], where + f" kwargs for {name}")
            placement = _apply_kwargs(rule, kind, where)
            if kind == "experts":
                backend = str(rule.kwargs.get("backend", "Auto"))
                check_name(backend, where)
                if used_backend and used_backend[0] != backend:
                    raise TesseraError(where, f"backend {backend} differs from {used_backend[0]} set by "
                                       f"{used_backend[1]}: one CPU backend serves all layers")
                used_backend = (backend, rule.label)
                for key in ("gpu_experts", "gpu_experts_ratio"):
                    if key in rule.kwargs:
                        if gpu_experts and gpu_experts[0] != (key, rule.kwargs[key]):
                            raise TesseraError(where, f"{key} differs from the value set by {gpu_experts[1]}")
                        gpu_experts = ((key, rule.kwargs[key]), rule.label)
            break
        plan.parts[name] = placement
    if used_backend:
        plan.experts_backend = used_backend[0]
    experts_parts = [p for n, p in plan.parts.items() if n.endswith(".mlp.experts")]
    if any(p.prefill_device != "cpu" for p in experts_parts):
        threshold = next((r.kwargs["gpu_prefill_threshold"] for r in rules if "gpu_prefill_threshold" in r.kwargs), 128)
        if not isinstance(threshold, int) or isinstance(threshold, bool) or threshold < 1:
            raise TesseraError(source, "gpu_prefill_threshold must be a whole number of tokens, 1 or more")
        plan.gpu_prefill_threshold = threshold
    if gpu_experts:
        (key, value), label = gpu_experts
        where = f"{source}: {label}"
        if key == "gpu_experts":
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise TesseraError(where, "gpu_experts must be a whole number of experts per layer, 0 or more")
            plan.gpu_experts_per_layer = value
        else:
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 1:
                raise TesseraError(where, "gpu_experts_ratio must be a number from 0 to 1")
            plan.gpu_experts_ratio = float(value)
    return plan


def load_plan(path: str | Path, num_layers: int, moe_layers: list[bool]) -> PlacementPlan:
    return plan_from_rules(load_rules(path), num_layers, moe_layers, source=str(path))


def _kind_matches(match_kind: str, kind: str) -> bool:
    if match_kind == "linear":
        return kind in ("router", "lm_head")
    return match_kind == kind


def _apply_kwargs(rule: _Rule, kind: str, where: str) -> PartPlacement:
    kw = rule.kwargs
    prefill = str(kw.get("prefill_device", "cpu"))
    generate = str(kw.get("generate_device", "cpu"))
    for key in ("prefill_device", "generate_device", "out_device"):
        if key in kw:
            _check_device(str(kw[key]), f"{where} {key}")
    for key in ("generate_op", "prefill_op"):
        if key not in kw:
            continue
        op = str(kw[key])
        known = _EXPERT_OPS if kind == "experts" else _LINEAR_OPS
        if op not in known:
            raise TesseraError(where, f"{key} {op!r} is not an op Tessera maps; accepted: " + ", ".join(sorted(known)))
        if kind == "experts" and _EXPERT_OPS[op] is not None:
            device = generate if key == "generate_op" else prefill
            if not device.startswith(_EXPERT_OPS[op]):
                raise TesseraError(where, f"{key} {op} computes on {_EXPERT_OPS[op]} but the device is {device}")
    if kind == "experts" and generate != "cpu":
        raise TesseraError(where, "routed experts are generated on the CPU backend (generate_device: cpu); put hot "
                           "experts on the GPU with gpu_experts instead")
    if kind != "experts" and prefill != generate:
        # Attention's KV cache lives where attention runs; moving it between phases would cost more than it saves.
        raise TesseraError(where, f"prefill_device {prefill} differs from generate_device {generate}: only the routed "
                           "experts may prefill on another device")
    return PartPlacement(prefill, generate, rule.label)


def _check_device(device: str, where: str) -> None:
    if not _DEVICE_RE.match(device):
        raise TesseraError(where, f"unknown device {device!r}: use cpu, cuda or cuda:N")


def _no_unknown(mapping: dict, allowed: set[str], where: str) -> None:
    unknown = sorted(set(map(str, mapping)) - allowed)
    if unknown:
        raise TesseraError(where, f"unknown key {unknown[0]!r}; accepted: " + ", ".join(sorted(allowed)))


def check_cuda_available(plan: PlacementPlan) -> None:
    """Raise a clear error when the plan needs CUDA and this machine has none (the caller may offer the CPU twin)."""
    if not plan.needs_cuda():
        return
    import torch

    if not torch.cuda.is_available():
        raise TesseraError(
            "placement",
            f"the plan puts parts on {plan.accelerator} but no CUDA device is available "
            f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}); run everything on the CPU instead",
        )
