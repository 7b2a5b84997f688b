"""The credit-method interface and its registry: one file per method declares a ``CreditMethod`` subclass.

A method turns a rollout batch into per-token advantages (B, T):

    Â_{i,t} = f(batch, spans, model)        multiplicative methods: Â_{i,t} = A_i · w_{i,t}  (``scaled``)

and declares, once, what everything else reads:
- ``name`` (the study config's ``credit``, the prefix of its logged metrics),
- ``options``: a dataclass whose fields are the method's config keys, each with ``metadata["help"]`` and, where
  numeric, ``metadata["range"]`` (a ``Range``); a ``Literal`` annotation is a choice. GrailGRPOConfig inherits
  the built-in methods' option dataclasses, so the schema drift tests, the config validation and the docs read them,
- ``needs_model`` (it runs the policy) and ``shares_loss_forward`` (that pass can be the loss's own forward),
- ``headline``: at most four of its logged statistics that the training-curve figure leads with.

A method that reads the policy's per-token log-probs or entropies calls ``inputs.token_statistics()``
(``TokenStatistics``): at the sampling temperature, from the loss's own forward when the trainer lets the method
make it (one forward per micro-step, as GRPO's), else from one no-grad forward; docs/credit-methods.md.

``advantages(inputs)`` returns a ``CreditResult``: the (B, T) advantages, the (B, T) weights of a multiplicative
method (the token viewer's column; None for others) and its statistics, in logging order: a float is logged as
its across-process nan-mean under ``<name>/<key>``, a 1-D tensor of per-row values as ``<key>_p10``/``_p90``.

A method whose statistic needs each prompt's whole group of rollouts (KTAE, GTPO: anything over a group's rewards)
declares ``groups = True`` and defines ``group_advantages(inputs: GroupInputs)`` instead: the trainer calls it once
per generation batch, where TRL computes the advantages, with every group whole (the rows of all processes
gathered, before TRL shuffles the batch and splits it into micro-steps), and the rows' per-token advantages then
travel with them into the micro-steps. ``advantages`` sees only a micro-step's rows: with 16 rows per device and 4
accumulation steps each call held shuffled fragments of 1-5 rows of a group.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from pipeline.core.declared import Range
from pipeline.core.deferred import DeferredModule
from pipeline.core.io import InputError
from pipeline.core.specs import dataclass_from_mapping
from pipeline.credit.saliency import at_least_float32
from pipeline.credit.settings import declared_value_problems

if TYPE_CHECKING:
    import torch
    from torch import nn
else:  # torch at first use: planning loads the credit methods without it (pipeline.core.deferred)
    torch = DeferredModule("torch")
    nn = DeferredModule("torch.nn")

__all__ = [
    "CreditHost",
    "CreditInputs",
    "CreditMethod",
    "CreditResult",
    "GroupInputs",
    "OfflineHost",
    "Range",
    "TokenStatistics",
    "carries_loss",
    "full_sequence",
    "logps_and_entropies_from_logits",
    "scaled",
]


class CreditHost(Protocol):
    """What a method may use of the trainer (``pipeline.training.trainer.GrailGRPOTrainer`` implements it)."""

    args: Any  # the GrailGRPOConfig
    accelerator: Any
    processing_class: Any  # the tokenizer (TRL's trainer attribute): what a method that reads the text decodes with
    temperature: float
    aux_loss_enabled: bool

    def loss_forward(self, model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, T: int) -> tuple:
        """TRL's own forward of the loss: (log-probs (B, T), entropies (B, T), aux loss or None) of the last ``T``
        positions (the completion), the logits divided by ``temperature``, 0 where ``attention_mask`` is 0; with
        the graph when grad is enabled."""

    def memoise_loss_forward(self, outputs: tuple) -> None:
        """Hand a forward made here to the loss, which then makes none (without it, the loss makes a second)."""

    def credit_generator(self) -> torch.Generator:
        """The run's seeded generator for a method's noise (seed + process index; checkpointed with the run)."""


def logps_and_entropies_from_logits(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, T: int, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) log-probs of the last ``T`` tokens and the entropies of their distributions, from the model's logits
    divided by ``temperature``, in the logits' precision (at least float32), 0 where ``attention_mask`` is 0:

        log p_t = z_t[x_t] / τ - logsumexp(z_t / τ),    H_t = -Σ_v p_t(v) log p_t(v)

    (TRL's ``selective_log_softmax_and_entropy`` on the full logits). What TRL's fused LM head returns, except that
    it sums in float32 whatever the model's precision."""
    from trl.trainer.utils import selective_log_softmax_and_entropy  # imports TRL: only when a method asks

    logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=T + 1).logits
    return selective_log_softmax_and_entropy(
        logits[:, :-1].to(at_least_float32(logits.dtype)),
        input_ids[:, -T:],
        temperature=temperature,
        row_mask=attention_mask[:, -T:],
    )


@dataclass
class OfflineHost:
    """A ``CreditHost`` outside training (the token viewer): one process, the model as loaded, and no loss to share
    a forward with (its ``CreditInputs`` have ``share_loss_forward=False``: ``memoise_loss_forward`` raises);
    ``loss_forward`` is a plain forward with the loss's temperature scaling."""

    args: Any  # the GrailGRPOConfig the method was built from
    accelerator: Any  # an ``accelerate.Accelerator`` of the model's device: unwrap_model, autocast, num_processes
    processing_class: Any = None  # the tokenizer, as the trainer's
    aux_loss_enabled: bool = False
    _generator: torch.Generator | None = None

    @property
    def temperature(self) -> float:
        return self.args.temperature

    def loss_forward(self, model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, T: int) -> tuple:
        """The trainer's ``loss_forward`` on a model without TRL's fused head: the model's logits of the last ``T``
        positions, divided by ``temperature`` in TRL's ``selective_log_softmax_and_entropy``; no aux loss."""
        with self.accelerator.autocast():
            logps, entropies = logps_and_entropies_from_logits(model, input_ids, attention_mask, T, self.temperature)
        return logps, entropies, None

    def memoise_loss_forward(self, outputs: tuple) -> None:
        raise RuntimeError("no loss forward outside training: build CreditInputs with share_loss_forward=False")

    def credit_generator(self) -> torch.Generator:
        """Seeded with ``args.seed`` on first use, as the trainer's on process 0."""
        if self._generator is None:
            self._generator = torch.Generator(device=self.accelerator.device).manual_seed(self.args.seed)
        return self._generator


@dataclass(frozen=True)
class TokenStatistics:
    """The policy's per-token statistics of a batch's completions at the sampling temperature τ, each (B, T)
    at least float32, 0 on padding, detached (no gradient flows through a weight made from them):

        logps[i, t]     = log π_τ(y_{i,t} | x_i, y_{i,<t}),         π_τ = softmax(logits / τ)
        entropies[i, t] = -Σ_v π_τ(v | x_i, y_{i,<t}) log π_τ(v | x_i, y_{i,<t})
    """

    logps: torch.Tensor
    entropies: torch.Tensor


@dataclass
class CreditInputs:
    """One batch as TRL's loss sees it: ``batch`` holds prompt_ids, prompt_mask, completion_ids, completion_mask
    (B, T) and the sequence advantages (B,); ``spans`` (B, 3) the boxed answers (``find_boxed_spans``)."""

    batch: dict[str, Any]
    spans: torch.Tensor
    model: nn.Module  # the policy as TRL's loss calls it (wrapped); ``unwrapped`` for attribution passes
    host: CreditHost
    share_loss_forward: bool  # make the loss's forward here (``host.loss_forward``) and memoise it
    _statistics: TokenStatistics | None = field(default=None, init=False, repr=False)

    @property
    def unwrapped(self) -> nn.Module:
        return self.host.accelerator.unwrap_model(self.model)

    def token_statistics(self) -> TokenStatistics:
        """The batch's ``TokenStatistics``, from one forward made on first call: under ``share_loss_forward`` the
        loss's own (``host.loss_forward``, memoised, so the loss makes none), else a no-grad one of its own."""
        if self._statistics is None:
            input_ids, attention_mask = full_sequence(self.batch)
            T = self.batch["completion_ids"].size(1)
            if self.share_loss_forward:
                outputs = self.host.loss_forward(self.model, input_ids, attention_mask, T)
                self.host.memoise_loss_forward(outputs)
            else:
                with torch.no_grad():
                    outputs = self.host.loss_forward(self.model, input_ids, attention_mask, T)
            dtype = at_least_float32(outputs[0].dtype)
            self._statistics = TokenStatistics(outputs[0].detach().to(dtype), outputs[1].detach().to(dtype))
        return self._statistics


@dataclass(frozen=True)
class GroupInputs:
    """A whole generation batch of N rollouts in groups, as TRL scores it (all processes' rows, in TRL's order):

        completion_ids, completion_mask   (N, T)  the completions, right-padded (mask 0 on padding)
        rewards                           (N,)    each rollout's weighted reward sum (NaN: no reward function scored it)
        advantages                        (N,)    TRL's group-normalised sequence advantages A_i (0 where NaN)
        group_ids                         (N,)    g_i = i // G, G = ``group_size``: row i belongs to prompt group g_i
        statistics                                ``TokenStatistics`` (N, T) of the policy that sampled the batch,
                                                  for a method with ``token_statistics = True``; else None

    A group is G consecutive rows (TRL's sampler repeats each prompt G times in a row); building one from rows that
    do not hold every group whole is refused, naming the first group that is cut."""

    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    rewards: torch.Tensor
    advantages: torch.Tensor
    group_ids: torch.Tensor
    group_size: int
    statistics: TokenStatistics | None = None

    def __post_init__(self) -> None:
        rows = self.group_ids.numel()
        for name in ("completion_ids", "completion_mask", "rewards", "advantages"):
            if getattr(self, name).size(0) != rows:
                raise InputError(f"GroupInputs: {name} has {getattr(self, name).size(0)} rows, group_ids {rows}")
        if problem := cut_group(self.group_ids, self.group_size):
            raise InputError(f"a group credit method needs whole groups of {self.group_size} rollouts: {problem}")

    @property
    def groups(self) -> int:
        return self.group_ids.numel() // self.group_size


def cut_group(group_ids: torch.Tensor, group_size: int) -> str | None:
    """What is wrong when ``group_ids`` are not whole groups of ``group_size`` consecutive rows, else None."""
    ids = group_ids.tolist()
    for group, held in Counter(ids).items():
        if held != group_size:
            return f"group {group} holds {held} of its {group_size} rollouts (a fragment)"
    for start in range(0, len(ids), group_size):
        if len(held := sorted(set(ids[start : start + group_size]))) > 1:
            return f"group {ids[start]} is not {group_size} consecutive rows (rows {start}-{start + group_size - 1} hold groups {held})"
    return None


@dataclass
class CreditResult:
    advantages: torch.Tensor  # (B, T) per-token advantages
    weights: torch.Tensor | None  # (B, T) w of Â = A · w, or None for a method that is not multiplicative
    stats: dict[str, float | torch.Tensor]  # logged under the method's name (module docstring)


class CreditMethod:
    """Base of every credit method (module docstring); one instance per trainer, built from its options."""

    name: ClassVar[str]
    options: ClassVar[type]  # a dataclass
    needs_model: ClassVar[bool] = False
    needs_spans: ClassVar[bool] = True
    headline: ClassVar[tuple[str, ...]] = ()
    per_token: ClassVar[bool] = True  # False: the advantages stay TRL's (B,) ones, the loss is TRL's own
    groups: ClassVar[bool] = False  # True: ``group_advantages`` on whole groups, once per generation batch
    token_statistics: ClassVar[bool] = False  # GroupInputs.statistics: a no-grad forward per micro-batch
    required: ClassVar[dict[str, str]] = {}  # option -> why a study config must set it explicitly

    @classmethod
    def configure(cls, options: Any, args: Any) -> None:
        """Set TRL options the method is built on (GrailGRPOConfig.__post_init__, before TRL's own checks)."""

    def __init__(self, options: Any, args: Any) -> None:
        self.opts = options
        self.args = args  # the GrailGRPOConfig: TRL's settings (batch size, temperature) and the shared options

    @property
    def shares_loss_forward(self) -> bool:
        """Whether ``advantages`` makes the loss's forward when asked to (``CreditInputs.share_loss_forward``)."""
        return False

    @property
    def per_generation(self) -> bool:
        """Compute once per generation round instead of at every micro-step (the shared ``grail_recompute``)."""
        return self.args.grail_recompute == "per_generation"

    def advantages(self, inputs: CreditInputs) -> CreditResult:
        raise NotImplementedError(f"credit method {self.name!r} defines no advantages()")

    def group_advantages(self, inputs: GroupInputs) -> CreditResult:
        """The (N, T) advantages (and weights, statistics) of a whole generation batch (``groups = True``)."""
        raise NotImplementedError(f"credit method {self.name!r} declares groups but defines no group_advantages()")


def scaled(advantages: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Â_{i,t} = A_i · w_{i,t}: (B,) sequence advantages times (B, T) weights."""
    return advantages.unsqueeze(1) * weights


def full_sequence(batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) of prompt followed by completion, as TRL's loss builds them."""
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    return input_ids, torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)


def in_chunks(function: Callable, leading: tuple, rows: tuple[torch.Tensor, ...], size: int, **kwargs) -> torch.Tensor:
    """``function(*leading, *chunk, **kwargs)`` over row chunks of ``size`` of ``rows``, concatenated (B, T)."""
    empty = rows[-1].new_empty((0, rows[-1].size(1)), dtype=torch.float32)
    starts = range(0, rows[0].size(0), size)
    return torch.cat([empty, *(function(*leading, *(r[s : s + size] for r in rows), **kwargs) for s in starts)])


def carries_loss(batch: dict[str, Any]) -> torch.Tensor:
    """(B,) bool: rows whose advantage is non-zero and that have a token; the others contribute no loss."""
    return (batch["advantages"] != 0) & (batch["completion_mask"].sum(-1) > 0)


def build_options(method: type[CreditMethod], flat: dict[str, Any], nested: Any) -> Any:
    """``method.options`` from the config's top-level keys that name its fields (``flat``; the built-in methods'
    options are GrailGRPOConfig fields) and its ``credit_options`` mapping (``nested``, every other option).
    Unknown keys, mistyped values, values outside a ``Literal`` or ``Range`` and the options' own
    ``check_values()`` are refused with the method and the key named."""
    where = f"credit {method.name}: credit_options"
    if not isinstance(nested, dict):
        raise InputError(f"{where}: expected a mapping, got {type(nested).__name__}")
    if clash := sorted(set(nested) & set(flat)):
        raise InputError(f"{where}: {clash} are top-level config keys; set them there")
    names = {option.name for option in dataclasses.fields(method.options)}
    own = {key: value for key, value in flat.items() if key in names}
    options = dataclass_from_mapping(method.options, {**own, **nested}, where)
    if problems := declared_value_problems(options):
        name, problem = problems[0]
        raise InputError(f"credit {method.name}: {name} {problem}")
    if hasattr(options, "check_values"):
        try:
            options.check_values()
        except InputError as error:
            raise InputError(f"credit {method.name}: {error}") from error
    return options


# ------------------------------------------------------------------------------------------------ the registry

METHODS_PACKAGE = "pipeline.credit.methods"  # a built-in method is a module there, named as the method
_LOADED: dict[str, type[CreditMethod]] = {}


def built_in_names() -> list[str]:
    """The built-in methods' names: the modules of ``pipeline/credit/methods/``, sorted."""
    package = importlib.import_module(METHODS_PACKAGE)
    return sorted(info.name for info in pkgutil.iter_modules(package.__path__) if not info.name.startswith("_"))


# What the registry's errors say a ``credit`` that is not a built-in name must be.
IMPORT_PATH = (
    "the import path of a module on the PYTHONPATH (Python names joined by dots, no `.py`: "
    "late_tokens, mylab.credit.halfway)"
)


def credit_module(credit: str) -> str:
    """The module a config's ``credit`` names: a built-in method's file (``METHODS_PACKAGE.<credit>``), else the
    import path ``credit`` itself, dotted or not (a built-in name wins over a top-level module of that name)."""
    return f"{METHODS_PACKAGE}.{credit}" if credit in built_in_names() else credit


def credit_method(credit: str) -> type[CreditMethod]:
    """The method a config's ``credit`` names: a built-in name, or the import path of any module (``late_tokens``,
    ``mylab.credit.halfway``) that defines ``METHOD``, a ``CreditMethod`` subclass; loaded and registered on
    first use."""
    if credit in _LOADED:
        return _LOADED[credit]
    if not isinstance(credit, str) or not all(part.isidentifier() for part in credit.split(".")):
        raise InputError(f"credit must be one of {built_in_names()} or {IMPORT_PATH}, got {credit!r}")
    module_name = credit_module(credit)
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise InputError(
            f"credit must be one of {built_in_names()} or {IMPORT_PATH}; cannot import {credit!r}: {error}"
        ) from error
    method = getattr(module, "METHOD", None)
    if not (isinstance(method, type) and issubclass(method, CreditMethod)):
        raise InputError(f"credit {credit!r}: module {module_name!r} defines no METHOD (a CreditMethod subclass)")
    if not (
        isinstance(getattr(method, "name", None), str) and dataclasses.is_dataclass(getattr(method, "options", None))
    ):
        raise InputError(f"credit {credit!r}: its METHOD needs a `name` (str) and an `options` dataclass")
    if module_name != credit and method.name != credit:
        raise InputError(f"credit {credit!r}: {module_name}.METHOD is named {method.name!r}")
    _LOADED[credit] = method
    return method


def built_in_methods() -> list[type[CreditMethod]]:
    """Every built-in method, by name."""
    return [credit_method(name) for name in built_in_names()]
