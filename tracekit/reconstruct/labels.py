"""Label rules as data: which annotation names are pipeline actions, and what they say.

A rule is a regular expression over a ``user_annotation`` (``record_function`` or NVTX
range) name, or a Python frame's (``python_function``: the few that ingest keeps, see
:func:`tracekit.model.names.is_action_frame`), and a role:

- ``F``, ``B``, ``I``, ``W``: the range is that kind of compute action;
- ``kind``: the kind is the text of the group ``kind`` (``F``/``B``/``I``/``W``, or
  ``Forward``/``Backward``, ``fwd``/``bwd`` in any case);
- ``FB``: a forward and a backward fused in one range (DualPipeV's ``OVERLAP_F_B``), split
  at the first autograd op; groups ``stage``/``mb`` for the forward, ``bstage``/``bmb``
  for the backward;
- ``comm``: a communication range (never compute; segmentation breaks there);
- ``marker``: a range the framework leaves that is no action (schedule phases, engine
  entry points): counted and reported, nothing more.

Named groups ``stage`` and ``mb`` give the stage and microbatch. Without ``stage`` the
stage is the rank (one stage per rank). Without ``mb`` the rule is *layer-level*: a run of
consecutive ranges of the same kind on one thread, with no point-to-point op between them,
is one action, and microbatches count up in order of appearance per rank and kind (what
hand-labelled per-layer ranges such as ``attn(F)``, ``mlp(F)`` need).

A table *placed by chains* (``megatron-torch``: Megatron's ``forward_step`` /
``backward_step`` frames, one whole action each, in every schedule) names neither stage nor
microbatch, and a rank may hold several stages (interleaving). Its actions are placed as
segmented ones are: forwards count up in order of appearance, a backward is the forward
whose autograd sequence numbers it consumes, and the message chains give stage and
microbatch (:mod:`.chains`).

The built-in tables (:data:`BUILTIN`) describe what the frameworks write (each table says
which framework writes its names and what they mark), most specific first; the first whose action rules match a
range is used and reported (``labels: torch-pp``). User rules (``--label-rule``, ``[tool.tracekit.labels]``)
come first; where they match nothing the built-in tables are tried and a warning says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tracekit.errors import TracekitError
from tracekit.model.names import LIBRARY_RANGES, MEGATRON_BACKWARD_FRAME, MEGATRON_FORWARD_FRAME

ACTION_ROLES = ("F", "B", "I", "W", "kind", "FB")
ROLES = ACTION_ROLES + ("comm", "marker")
_GROUPS = {"stage", "mb", "kind", "bstage", "bmb"}
_KIND_WORDS = {
    "f": "F",
    "forward": "F",
    "fwd": "F",
    "b": "B",
    "backward": "B",
    "bwd": "B",
    "i": "I",
    "input": "I",
    "w": "W",
    "weight": "W",
}


@dataclass(frozen=True)
class LabelRule:
    """One pattern and what a range whose name matches it is."""

    pattern: str
    role: str
    origin: str = "built-in"
    regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "regex", re.compile(self.pattern))

    @property
    def is_action(self) -> bool:
        return self.role in ACTION_ROLES

    @property
    def layer_level(self) -> bool:
        """No microbatch in the name: consecutive ranges make one action."""
        return self.is_action and self.role != "FB" and "mb" not in self.regex.groupindex

    def parse(self, name: str, rank: int) -> list[tuple[str, int, int]] | None:
        """The actions ``name`` stands for as (kind, stage, microbatch; -1 = count in order),
        [] for a non-action match, None for no match."""
        match = self.regex.search(name)
        if match is None:
            return None
        if not self.is_action:
            return []
        groups = match.groupdict()
        stage = int(groups["stage"]) if groups.get("stage") is not None else rank
        mb = int(groups["mb"]) if groups.get("mb") is not None else -1
        if self.role == "FB":
            b_stage = int(groups["bstage"]) if groups.get("bstage") is not None else stage
            b_mb = int(groups["bmb"]) if groups.get("bmb") is not None else mb
            return [("F", stage, mb), ("B", b_stage, b_mb)]
        kind = self.role
        if kind == "kind":
            kind = _KIND_WORDS.get((groups.get("kind") or "").lower(), "")
            if not kind:
                return []
        return [(kind, stage, mb)]


@dataclass(frozen=True)
class LabelSet:
    """A framework's table of rules."""

    name: str
    rules: tuple[LabelRule, ...]
    what: str  # one line: which framework writes these and what they mark
    placed_by_chains: bool = False  # whole actions without stage or microbatch (see the module doc)

    def match(self, name: str) -> LabelRule | None:
        for rule in self.rules:
            if rule.regex.search(name):
                return rule
        return None


def _set(name: str, what: str, *rules: tuple[str, str], placed_by_chains: bool = False) -> LabelSet:
    return LabelSet(name, tuple(LabelRule(p, r, f"built-in {name}") for p, r in rules), what, placed_by_chains)


#: What the frameworks write, most specific first.
BUILTIN: tuple[LabelSet, ...] = (
    _set(
        "torch-pp",
        "torch.distributed.pipelining runtime schedules (PP:<stage><kind><mb>)",
        (r"^PP:(?P<stage>\d+)(?P<kind>[FIBW])(?P<mb>\d+)$", "kind"),
        (r"^PP:\((?P<stage>\d+)F(?P<mb>\d+);(?P<bstage>\d+)B(?P<bmb>\d+)\)OVERLAP_F_B$", "FB"),
        (r"^PP:\d+(SEND|RECV)_[FB]\d+$", "comm"),
        (r"^PP:\d+(UNSHARD|RESHARD|REDUCE_GRAD)", "comm"),
    ),
    _set(
        "torch-gpipe",
        "torch.distributed.pipelining ScheduleGPipe (Forward <mb> / Backward <mb>)",
        (r"^(?P<kind>Forward|Backward) (?P<mb>\d+)$", "kind"),
    ),
    _set(
        "layer-suffix",
        "hand-labelled layers with the action kind in a suffix (attn(F), mlp(B), ...)",
        (r"^[\w.:/ -]+\((?P<kind>[FBIW])\)$", "kind"),
    ),
    _set(
        "megatron-torch",
        "Megatron's forward_step / backward_step frames (torch.profiler with_stack)",
        (MEGATRON_FORWARD_FRAME, "F"),
        (MEGATRON_BACKWARD_FRAME, "B"),
        placed_by_chains=True,
    ),
    _set(
        "megatron-nvtx",
        "Megatron-LM's NVTX ranges: schedule phases and p2p_communication functions",
        (r"pipeline_parallel\.p2p_communication\.", "comm"),
        (r"pipeline_parallel\.schedules\.\w+\.(warmup|steady|cooldown)$", "marker"),
        (r"pipeline_parallel\.schedules\.forward_backward", "marker"),
    ),
    _set(
        "deepspeed-nvtx",
        "DeepSpeed's NVTX ranges (DeepSpeedEngine.forward per microbatch, .backward on the last stage only)",
        (r"^DeepSpeedEngine\.(forward|backward|step)$", "marker"),
        (r"^PipelineEngine\.", "marker"),
    ),
)


_NESTED_REPEAT = re.compile(r"\((?:[^()\\]|\\.)*[+*](?:[^()\\]|\\.)*\)[+*{]")


def parse_rule(text: str, origin: str) -> LabelRule:
    """``REGEX=KIND`` (split at the last ``=``) as a rule; a bad one is one line."""
    pattern, sep, role = text.rpartition("=")
    if not sep or not pattern:
        raise TracekitError(
            f"{origin} {text!r}: write REGEX=KIND, e.g. 'fwd_(?P<mb>\\d+)=F' (KIND: {', '.join(ROLES)})"
        )
    return rule_of(pattern, role.strip(), origin)


def rule_of(pattern: str, role: str, origin: str) -> LabelRule:
    if role not in ROLES:
        raise TracekitError(f"{origin} {pattern!r}: unknown kind {role!r}; use one of {', '.join(ROLES)}")
    try:
        rule = LabelRule(pattern, role, origin)
    except re.error as err:
        raise TracekitError(f"{origin} {pattern!r}: not a regular expression ({err})") from None
    unknown = set(rule.regex.groupindex) - _GROUPS
    if unknown:
        raise TracekitError(
            f"{origin} {pattern!r}: unknown group(s) {', '.join(sorted(unknown))}; "
            f"name groups {', '.join(sorted(_GROUPS))} (or use (?:...))"
        )
    if role == "kind" and "kind" not in rule.regex.groupindex:
        raise TracekitError(f"{origin} {pattern!r}: KIND 'kind' needs a group (?P<kind>...) holding F, B, I or W")
    if _NESTED_REPEAT.search(pattern):
        # (a+)+ style patterns backtrack exponentially on a near-miss: a hang, not an answer
        raise TracekitError(
            f"{origin} {pattern!r}: a repeated group that repeats inside ((x+)+, (x*)*) can take "
            "exponential time on names that almost match; repeat the group once, e.g. (x+)"
        )
    if rule.regex.search("") is not None:
        raise TracekitError(
            f"{origin} {pattern!r}: matches the empty name, so every range; anchor it, e.g. '^fwd_(?P<mb>\\d+)$'"
        )
    return rule


def custom_set(rules: list[LabelRule]) -> LabelSet | None:
    if not rules:
        return None
    origins = sorted({r.origin for r in rules})
    return LabelSet("custom", tuple(rules), f"{len(rules)} rule(s) from {', '.join(origins)}")


@dataclass
class LabelChoice:
    """Which table labelled the run, and what each table matched (for the report)."""

    used: LabelSet | None  # the table whose action rules gave the actions
    markers: list[LabelSet] = field(default_factory=list)  # tables that matched only non-actions
    counts: dict[str, int] = field(default_factory=dict)  # table name -> ranges matched
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        names = ([self.used.name] if self.used else []) + [m.name for m in self.markers]
        return " + ".join(names) if names else "none"


def choose(names_and_counts: dict[str, int], custom: LabelSet | None) -> LabelChoice:
    """Pick the table for a run from its distinct annotation names and how often each occurs."""
    choice = LabelChoice(used=None)
    tables = ([custom] if custom else []) + list(BUILTIN)
    for table in tables:
        actions = other = 0
        for name, n in names_and_counts.items():
            rule = table.match(name)
            if rule is None:
                continue
            if rule.is_action:
                actions += n
            else:
                other += n
        if actions + other:
            choice.counts[table.name] = actions + other
        if table is custom and not actions:
            choice.notes.append(
                f"--label-rule / [tool.tracekit.labels]: no rule matched an action range "
                f"({custom.what}); {_top_names(names_and_counts)}"
            )
        if actions and choice.used is None:
            choice.used = table  # user rules first, then the most specific built-in table
        elif not actions and other and table is not custom:
            choice.markers.append(table)
    return choice


def _top_names(names_and_counts: dict[str, int], k: int = 3) -> str:
    candidates = {n: c for n, c in names_and_counts.items() if not n.startswith(LIBRARY_RANGES)}
    top = sorted(candidates.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
    if not top and names_and_counts:  # every one a library's own range (NCCL, c10d, ...)
        library = sorted(names_and_counts.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
        return "all of them libraries' own ranges: " + ", ".join(f"`{n}` ×{c}" for n, c in library)
    if not top:
        return "the traces hold no user annotations"
    return "top annotations: " + ", ".join(f"`{n}` ×{c}" for n, c in top)


def describe_annotations(names_and_counts: dict[str, int]) -> str:
    """ "40 user annotations, top: `attn(F)` ×4, ..." for a run where no pipeline was found."""
    total = sum(names_and_counts.values())
    if not total:
        return "no user annotations"
    return f"{total} user annotation(s) of {len(names_and_counts)} name(s), {_top_names(names_and_counts)}"


# Megatron-core's p2p_communication functions (NVTX ranges under nsys): where each one's
# sends and receives go, in the order batch_isend_irecv posts them (send to the previous
# rank, receive from it, send to the next, receive from it; _batched_p2p_ops).
MEGATRON_P2P = re.compile(r"pipeline_parallel\.p2p_communication\.(?P<fn>\w+)$")
_MEGATRON_WAYS = {
    "recv_forward": ((), ("prev",)),
    "recv_backward": ((), ("next",)),
    "send_forward": (("next",), ()),
    "send_backward": (("prev",), ()),
    "send_forward_recv_backward": (("next",), ("next",)),
    "send_backward_recv_forward": (("prev",), ("prev",)),
    "send_forward_recv_forward": (("next",), ("prev",)),
    "send_backward_recv_backward": (("prev",), ("next",)),
    "send_forward_backward_recv_forward_backward": (("prev", "next"), ("prev", "next")),
}


# torch.distributed.pipelining's runtime wraps each P2P op in a range naming the stage, the
# way and the microbatch (schedules.py: ``"PP:" + str(action)``, actions SEND_F, RECV_F,
# SEND_B, RECV_B).
TORCH_PP_P2P = re.compile(r"^PP:(?P<stage>\d+)(?P<op>SEND|RECV)_(?P<way>[FB])(?P<mb>\d+)$")


def p2p_action(name: str) -> tuple[int, str, int] | None:
    """(stage, "F" or "B", microbatch) of the action whose data a torch pipelining P2P range
    sends or receives (``PP:4SEND_F4``: stage 4's forward of microbatch 4 sends its output;
    ``PP:3RECV_B0``: stage 3's backward of microbatch 0 receives its gradient); None for
    any other name."""
    match = TORCH_PP_P2P.match(name)
    if match is None:
        return None
    return int(match.group("stage")), match.group("way"), int(match.group("mb"))


def p2p_ways(name: str) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """(the ways of the sends, of the receives) a range's name says its P2P ops go, each
    "next" or "prev" pipeline rank; None for a name that says nothing."""
    match = MEGATRON_P2P.search(name)
    return _MEGATRON_WAYS.get(match.group("fn")) if match else None
