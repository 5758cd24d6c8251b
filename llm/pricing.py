"""Cost of a call from the price table (prices per 1M input / output tokens).

The built-in deterministic planner (``demo/planner``) carries a **demo price** (:data:`DEMO_PRICES`), so the spend
view, budgets and cost metrics show money in embedded mode. It is not the price of any real model: every place that
shows it says "demo price" (see :func:`is_demo_price`), and no other model is priced by it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from llm.config import ModelInfo, ProviderConfig
from runtime.types import Usage

#: The label shown next to a cost computed from :data:`DEMO_PRICES`.
DEMO_PRICE_LABEL = "demo price"

#: The built-in demo provider's models: invented round figures (USD per 1M tokens), not any vendor's price list.
DEMO_PRICES: Mapping[str, ModelInfo] = {
    "planner": ModelInfo(context_window=128_000, price_in_per_1m=1.0, price_out_per_1m=4.0),
}

#: The provider name the demo prices belong to (the built-in deterministic provider).
DEMO_PROVIDER = "demo"


def is_demo_price(model: str) -> bool:
    """Whether ``"provider/model"`` is priced from the demo table (so its cost must be labelled "demo price")."""
    provider, _, name = model.partition("/")
    return provider == DEMO_PROVIDER and name in DEMO_PRICES


def demo_price_text() -> str:
    """``"USD 1.00 in / 4.00 out per 1M tokens"`` for the demo planner, to print beside the "demo price" label."""
    info = DEMO_PRICES["planner"]
    return f"USD {info.price_in_per_1m:.2f} in / {info.price_out_per_1m:.2f} out per 1M tokens"


class PriceTable:
    """``"provider/model"`` -> :class:`ModelInfo`; an unknown model costs 0 (and says so in the trace)."""

    def __init__(self, providers: Iterable[ProviderConfig] = ()) -> None:
        self._prices: dict[str, ModelInfo] = {}
        for provider in providers:
            for model, info in provider.models.items():
                self._prices[f"{provider.name}/{model}"] = info

    def known(self, model: str) -> bool:
        return model in self._prices

    def info(self, model: str) -> ModelInfo | None:
        return self._prices.get(model)

    def cost(self, model: str, input_tokens: int, output_tokens: int) -> float:
        info = self._prices.get(model)
        if info is None:
            return 0.0
        return round(input_tokens * info.price_in_per_1m / 1_000_000 + output_tokens * info.price_out_per_1m / 1_000_000, 10)

    def priced(self, model: str, usage: Usage) -> Usage:
        return Usage(usage.input_tokens, usage.output_tokens, self.cost(model, usage.input_tokens, usage.output_tokens))
