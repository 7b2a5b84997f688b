"""GRPO: no token credit; the sequence advantage A_i on every token, TRL's loss bit for bit."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.credit.method import CreditMethod


@dataclass
class GrpoOptions:
    """GRPO has no options."""


class Grpo(CreditMethod):
    name = "grpo"
    options = GrpoOptions
    needs_spans = False
    per_token = False


METHOD = Grpo
